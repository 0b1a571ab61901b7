// Package docs embeds the user-facing documents the console serves under
// /docs/, so the concepts its pages explain in a sentence are one click
// away, from the console's own origin.
package docs

import "embed"

// FS holds the documents served at /docs/<name> (without ".md").
//
//go:embed agents.md audit-actions.md sessions.md
var FS embed.FS
