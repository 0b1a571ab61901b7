// Package compose holds no code: its test parses the repository's
// docker-compose.yaml and the nginx front in this directory and checks
// that they run two console replicas on one Postgres behind one published
// port (there is no Docker engine in CI to run `docker compose config`).
package compose
