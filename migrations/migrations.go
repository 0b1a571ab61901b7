// Package migrations embeds the numbered SQL files that own the schema.
//
// Two sets: catalog/ (the platform database) and org/ (every organization's
// own database). A file is NNNN_name.sql when the SQL is the same for every
// dialect, or NNNN_name.sqlite.sql / NNNN_name.postgres.sql when it differs.
package migrations

import "embed"

// FS holds catalog/ and org/.
//
//go:embed catalog org
var FS embed.FS
