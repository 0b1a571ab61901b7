// Package spec holds envd's RPC contract (the .proto files of E2B's envd,
// Apache-2.0, see NOTICE) and the command that generates ../gen from it.
// The generators are pinned here and in buf.gen.yaml, so the committed code
// is what these versions make; TestGeneratedCodeIsCurrent checks it.
package spec

//go:generate go run github.com/bufbuild/buf/cmd/buf@v1.65.0 generate
