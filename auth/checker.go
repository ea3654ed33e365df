package auth

import (
	"net/netip"

	"github.com/valyala/fasthttp"
)

// Input is what a check may read of a request: its headers and what the gateway knows about
// the client. Checks never read the body.
type Input struct {
	// Header is the request's header, as received (the gateway has validated its framing).
	Header *fasthttp.RequestHeader
	// ClientIP is the client IP of SPEC 16.
	ClientIP netip.Addr
	// Scheme is "http" or "https": the scheme the client used (or the trusted proxy said).
	Scheme string
}

// Checker is one route's auth mechanism: Basic, JWT or Forward.
type Checker interface {
	// Check decides from the request's headers. It may wait, within the mechanism's own bound,
	// and must be called without holding a worker or a route slot.
	Check(in *Input) Verdict
	// Prepare edits the header of the request that is forwarded upstream after a passing
	// verdict: it removes what must not reach the upstream (the Basic credential, the client's
	// own copies of claim or auth-service headers) and sets v.Upstream.
	Prepare(h *fasthttp.RequestHeader, v *Verdict)
	// Close stops the mechanism's background work (a JWKS refresh, idle connections to the auth
	// service). Checks after Close still answer, from what was loaded.
	Close()
}

// setUpstream removes names from h, then sets the headers of v.
func setUpstream(h *fasthttp.RequestHeader, names []string, v *Verdict) {
	for _, n := range names {
		h.Del(n)
	}
	for _, u := range v.Upstream {
		h.Set(u.Name, u.Value)
	}
}
