package auth

import (
	"net/netip"
	"time"

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
	// Now is when the request arrived (the gateway's timestamp of its first byte), against
	// which a cached credential's expiry is checked: a check reads the clock only when it is
	// zero, or on a cache miss. It saves a clock read per request.
	Now time.Time
}

// now is in.Now, or the clock when it is zero.
func (in *Input) now() time.Time {
	if in.Now.IsZero() {
		return time.Now()
	}
	return in.Now
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

// canonicalNames are names in fasthttp's canonical form (X-User), as Field names are.
func canonicalNames(names []string) [][]byte {
	out := make([][]byte, len(names))
	for i, n := range names {
		out[i] = fasthttp.AppendNormalizedHeaderKey(nil, n)
	}
	return out
}

// setUpstream removes names from h, then sets the fields of v (add: adds them, so that a
// field appearing twice is sent twice). The names are canonical: SetCanonical skips the
// normalizing copy of Set.
func setUpstream(h *fasthttp.RequestHeader, names [][]byte, v *Verdict, add bool) {
	for _, n := range names {
		h.DelBytes(n)
	}
	for _, u := range v.Upstream {
		if add {
			h.AddBytesKV(u.Name, u.Value)
		} else {
			h.SetCanonical(u.Name, u.Value)
		}
	}
}
