// Package e2b is the E2B-compatible endpoint: what lets a runtime built on
// the E2B SDK run its sandboxes here, as sessions of an agent, by changing
// its settings and nothing else.
//
// It holds what the endpoint knows of sandboxes (sandbox.go): the ids the
// SDK sees, which name their org, the envd access tokens minted for them
// (sealed at rest), and the link from each to its agent session and to the
// e2b key that made it; and the resolver (resolve.go) that turns a sandbox
// id and token into the session and actor a data-plane request acts as.
//
// Its control plane (control.go) is E2B's sandbox API: the e2b key's
// authentication, create, list, connect, pause, timeout and kill, each a
// session of the key's agent, answered in E2B's shapes; the console mounts
// it on its router.
//
// Its data plane (envd.go and the files beside it) speaks envd's API
// (Connect RPC process and filesystem services, REST /files) to the SDK and
// carries out every call through the audited terminal gateway
// (internal/gateway). It never forwards to a backend's envd: a command the
// SDK starts is authorized by the agent's command policy, audited as
// command.exec and recorded like any other command of the session, and the
// backend's envd token never leaves the backend. The sandboxes need no envd
// at all, only agentd. The types of envd's API are generated into gen/ from
// the protos in spec/.
package e2b
