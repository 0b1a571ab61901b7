// Package web embeds the front-end assets under static/ so the binary
// needs nothing beside it.
package web

import (
	"embed"
	"io/fs"
)

//go:embed static
var embedded embed.FS

// Static is the static/ tree, served at /static/.
var Static, _ = fs.Sub(embedded, "static")
