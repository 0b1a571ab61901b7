// Package terminal is the browser terminal: a WebSocket bridged to the
// terminal gateway's operations (internal/gateway), each checked, recorded
// and audited there as if it came through the JSON API.
//
// The browser speaks JSON text messages: every keystroke is a Stdin
// (recorded before it is forwarded), every window change a Resize
// (audited), and output comes from Poll with a cursor. A client that
// reconnects names its command and the last chunk id it showed, and
// continues from there without losing or repeating output. A revocation
// (the org suspended, the credential signed out or its access removed)
// closes the terminal saying why.
package terminal
