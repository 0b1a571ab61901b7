// Package e2e holds end-to-end tests that drive the assembled console in a
// real headless Chromium (chromedp), against the embedded SQLite default and
// against Postgres. It has no non-test code beyond this comment; the tests
// need /usr/bin/chromium (apt-get install -y chromium) and fail, never skip,
// without it.
package e2e
