package gateway

import (
	"bytes"
	"fmt"
	"reflect"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"toron/auth"
	"toron/conf"
)

// Access control before the body (SPEC 19), decided in decide from the headers alone: the
// route's access lists right after routing (SPEC 3 step 4a, 403), its auth after the rate
// limit and before the bulkhead (step 6, 401, the auth service's own answer, or 503). Both run
// in the header hook, on the connection's goroutine, before a route slot or a worker is taken:
// a bcrypt wait (at most 100 ms), a JWKS refresh on an unknown kid (at most 500 ms) or a
// forward-auth call (its timeout) holds neither, so a slow auth service or a flood of wrong
// passwords costs the routes that do not use them nothing.

// The fixed answers of access control; the 401s and a relayed forward-auth answer vary per
// request and are built in the exchange (x.authRej).
var (
	rejForbidden       = &rejection{status: fasthttp.StatusForbidden, reason: reasonForbidden, body: auth.BodyForbidden}
	rejAuthBusy        = &rejection{status: fasthttp.StatusServiceUnavailable, reason: reasonAuthBusy, body: auth.BodyBusy}
	rejAuthUnavailable = &rejection{status: fasthttp.StatusServiceUnavailable, reason: reasonAuthUnavailable, body: auth.BodyUnavailable}
)

// routeAuth is a route's access control in one route table.
type routeAuth struct {
	access *auth.Access
	// checker is the route's auth mechanism, nil without auth; cfg is the block it was built
	// from, so that a reload that leaves it unchanged can keep it (and its caches, its JWKS,
	// its connections to the auth service).
	checker auth.Checker
	cfg     *conf.Auth
	// files says the checker read files at build (users_file, jwks_file): a reload re-reads
	// them, so such a checker is never kept.
	files bool
	// forward says the checker is forward auth, which is told the client's scheme.
	forward bool
}

// newRouteAuth builds the access control of route rc; nil when it has none. prev is the
// route's in the table in force, when there is one, whose checker is kept when its block did
// not change and it reads no file.
func (g *Gateway) newRouteAuth(rc *conf.Route, prev *routeAuth) (*routeAuth, error) {
	e := &rc.Effective
	if e.Access == nil && e.Auth == nil {
		return nil, nil
	}
	ra := &routeAuth{cfg: e.Auth}
	if a := e.Access; a != nil {
		allow, err := conf.ParsePrefixes(a.Allow)
		if err != nil {
			return nil, fmt.Errorf("gateway: route %q: access.allow: %w", rc.Name, err)
		}
		deny, err := conf.ParsePrefixes(a.Deny)
		if err != nil {
			return nil, fmt.Errorf("gateway: route %q: access.deny: %w", rc.Name, err)
		}
		ra.access = auth.NewAccess(allow, deny)
	}
	a := e.Auth
	if a == nil {
		return ra, nil
	}
	if prev != nil && prev.checker != nil && !prev.files && reflect.DeepEqual(prev.cfg, a) {
		ra.checker, ra.forward = prev.checker, prev.forward
		return ra, nil
	}
	var err error
	switch {
	case a.Basic != nil:
		ra.files = true
		ra.checker, err = auth.NewBasic(auth.BasicOptions{UsersFile: a.Basic.UsersFile, Realm: a.Basic.Realm})
	case a.JWT != nil:
		j := a.JWT
		ra.files = j.JWKSFile != ""
		name := rc.Name
		ra.checker, err = auth.NewJWT(auth.JWTOptions{
			JWKSFile: j.JWKSFile, JWKSURL: j.JWKSURL, JWKSRefresh: j.JWKSRefresh,
			Issuer: j.Issuer, Audience: j.Audience, Algorithms: j.Algorithms, Leeway: j.Leeway,
			From: j.From, ClaimsToHeaders: j.ClaimsToHeaders, ForwardToken: j.ForwardToken,
			OnError: func(err error) { g.log.Warn("JWKS fetch failed", zap.String("route", name), zap.Error(err)) },
		})
	case a.Forward != nil:
		ra.forward = true
		f := a.Forward
		ra.checker, err = auth.NewForward(auth.ForwardOptions{URL: f.URL, Timeout: f.Timeout, MaxConcurrency: f.MaxConcurrency,
			RequestHeaders: f.RequestHeaders, UpstreamHeaders: f.UpstreamHeaders})
	}
	if err != nil {
		return nil, fmt.Errorf("gateway: route %q: auth: %w", rc.Name, err)
	}
	return ra, nil
}

// buildAuth builds the checkers of cfg's routes, in route order, keeping the ones of prev that
// did not change (newRouteAuth). It runs before anything of the new table that cannot be
// undone (the Sets take over the serving targets, SPEC 18): on an error the checkers it made
// are closed and nothing else was touched.
func (g *Gateway) buildAuth(cfg *conf.Config, prev *snapshot) ([]*routeAuth, error) {
	old := map[string]*routeAuth{}
	if prev != nil {
		for _, r := range prev.routes {
			old[r.name] = r.ac
		}
	}
	acs := make([]*routeAuth, len(cfg.Routes))
	for i := range cfg.Routes {
		rc := &cfg.Routes[i]
		ac, err := g.newRouteAuth(rc, old[rc.Name])
		if err != nil {
			made := make([]*route, i)
			for j := range made {
				made[j] = &route{ac: acs[j]}
			}
			closeAuth(made, prev)
			return nil, err
		}
		acs[i] = ac
	}
	return acs, nil
}

// closeAuth closes the checkers of routes that next does not use (nil: all of them).
func closeAuth(routes []*route, next *snapshot) {
	kept := map[auth.Checker]bool{}
	if next != nil {
		for _, r := range next.routes {
			if r.ac != nil && r.ac.checker != nil {
				kept[r.ac.checker] = true
			}
		}
	}
	for _, r := range routes {
		if r.ac != nil && r.ac.checker != nil && !kept[r.ac.checker] {
			r.ac.checker.Close()
		}
	}
}

// allowsClient is SPEC 3 step 4a: the route's access lists on the client IP.
func (ra *routeAuth) allowsClient(x *exchange) bool {
	return ra == nil || ra.access.Allows(x.clientIP)
}

// authorize is the auth part of SPEC 3 step 6. A passing request's header is prepared for the
// upstream (the credential or the client's copies of identity headers removed, the verified
// ones set); a refused one is rejected with its verdict's answer.
func (g *Gateway) authorize(h *fasthttp.RequestHeader, x *exchange, ra *routeAuth) bool {
	if ra == nil || ra.checker == nil {
		return true
	}
	x.authIn = auth.Input{Header: h, ClientIP: x.clientIP, Now: x.start}
	if ra.forward {
		// The listener's scheme (g.proto is protoHTTP or protoHTTPS), or the one a trusted
		// proxy in front says the client used (SPEC 16), as the upstream request's
		// X-Forwarded-Proto does.
		x.authIn.Scheme = "http"
		if bytes.Equal(g.proto, protoHTTPS) {
			x.authIn.Scheme = "https"
		}
		if v := h.PeekBytes(hdrXForwardedProto); x.trustedPeer && len(v) > 0 {
			x.authIn.Scheme = string(v)
		}
	}
	// The verdict lives in the exchange: a local whose address goes to an interface method
	// would be allocated on every request.
	x.authVerdict = ra.checker.Check(&x.authIn)
	x.authIn.Header = nil
	v := &x.authVerdict
	if v.Outcome == auth.Pass {
		ra.checker.Prepare(h, v)
		return true
	}
	switch v.Outcome {
	case auth.Busy:
		x.reject(rejAuthBusy)
	case auth.Unavailable:
		x.reject(rejAuthUnavailable)
	default:
		r := reasonUnauthorized
		if v.Outcome == auth.Denied {
			r = reasonAuthDenied
		}
		x.authRej = rejection{status: v.Status, reason: r, body: v.Body}
		x.reject(&x.authRej)
	}
	return false
}

// writeAuthHeaders adds what an access-control answer carries beside its status and body: the
// challenge of a 401, Retry-After: 1 of a busy bcrypt, a forward-auth answer's own headers
// (its Content-Type replacing the JSON one).
func writeAuthHeaders(ctx *fasthttp.RequestCtx, x *exchange, r *rejection) {
	h := &ctx.Response.Header
	switch {
	case r == rejAuthBusy:
		h.Set(fasthttp.HeaderRetryAfter, "1")
	case r == &x.authRej && x.authVerdict.Outcome == auth.Unauthorized:
		h.Set(fasthttp.HeaderWWWAuthenticate, x.authVerdict.Challenge)
	case r == &x.authRej:
		h.Del(fasthttp.HeaderContentType)
		for _, rh := range x.authVerdict.Relay {
			h.Add(rh.Name, rh.Value)
		}
	}
}
