package agentd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"

	"github.com/gatehouse/gatehouse/internal/netguard"
)

// maxFetchRedirects matches net/http's default limit.
const maxFetchRedirects = 10

// errPrivateRedirect is returned (wrapped) when a download redirects to a
// refused address.
var errPrivateRedirect = errors.New("redirect to a loopback, link-local or metadata address refused")

// guardRedirects returns a copy of c whose redirects may not lead to
// loopback, link-local or metadata addresses. The check resolves the name
// itself, so a name that resolves differently a moment later (DNS
// rebinding) is not covered; the documentation says so.
func guardRedirects(c *http.Client, resolver *net.Resolver) *http.Client {
	guarded := *c
	next := c.CheckRedirect
	guarded.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if len(via) >= maxFetchRedirects {
			return fmt.Errorf("stopped after %d redirects", maxFetchRedirects)
		}
		if err := checkRedirectHost(req.Context(), resolver, req.URL.Hostname()); err != nil {
			return err
		}
		if next != nil {
			return next(req, via)
		}
		return nil
	}
	return &guarded
}

// checkRedirectHost refuses host when it is, or resolves to, a refused
// address.
func checkRedirectHost(ctx context.Context, resolver *net.Resolver, host string) error {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	switch host {
	case "localhost", "metadata", "metadata.google.internal", "instance-data", "instance-data.ec2.internal":
		return errPrivateRedirect
	}
	if strings.HasSuffix(host, ".localhost") {
		return errPrivateRedirect
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		if refusedAddr(ip) {
			return errPrivateRedirect
		}
		return nil
	}
	ips, err := resolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return fmt.Errorf("resolve redirect target: %w", err)
	}
	for _, ip := range ips {
		if refusedAddr(ip) {
			return errPrivateRedirect
		}
	}
	return nil
}

// refusedAddr reports loopback, link-local (which holds 169.254.169.254),
// unspecified, multicast and the other metadata service addresses, with
// the console's own outbound rule.
func refusedAddr(ip netip.Addr) bool { return netguard.Blocked(ip) != "" }
