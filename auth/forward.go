package auth

import (
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// Defaults and bounds of forward auth (SPEC 19).
const (
	// DefaultForwardTimeout bounds one call to the auth service, dial included.
	DefaultForwardTimeout = 2 * time.Second
	// DefaultForwardMaxConcurrency bounds the calls in flight to the auth service; a request
	// beyond it gets its 503 at once rather than queueing behind a slow service.
	DefaultForwardMaxConcurrency = 64
	// ForwardMaxBodyBytes bounds the body of an answer relayed to the client (a login page);
	// an auth service answering more is treated as unavailable.
	ForwardMaxBodyBytes = 64 << 10
	// forwardIdleConnTimeout is how long an idle connection to the auth service is kept.
	forwardIdleConnTimeout = 30 * time.Second
)

// Header names of the subrequest (nginx auth_request, Traefik forwardAuth).
const (
	headerForwardedMethod = "X-Forwarded-Method"
	headerForwardedProto  = "X-Forwarded-Proto"
	headerForwardedHost   = "X-Forwarded-Host"
	headerForwardedURI    = "X-Forwarded-Uri"
	headerForwardedFor    = "X-Forwarded-For"
)

// relayed are the headers of a non-2xx answer relayed to the client: the challenge, a login
// redirect, its cookies, and the type of the body.
var relayed = []string{fasthttp.HeaderWWWAuthenticate, fasthttp.HeaderLocation, fasthttp.HeaderContentType}

// ForwardOptions configures a Forward.
type ForwardOptions struct {
	// URL is the auth service, http:// or https://. Required.
	URL string
	// Timeout bounds one call; 0 means DefaultForwardTimeout.
	Timeout time.Duration
	// MaxConcurrency bounds the calls in flight; 0 means DefaultForwardMaxConcurrency.
	MaxConcurrency int
	// RequestHeaders are copied from the client's request to the subrequest.
	RequestHeaders []string
	// UpstreamHeaders are copied from a 2xx answer to the upstream request; the client's own
	// copies are always removed.
	UpstreamHeaders []string
}

// Forward asks an external service whether a request may pass: a GET with the request's
// method, scheme, host, URI and client IP in X-Forwarded-* headers. A 2xx admits, any other
// answer is relayed; no answer within the timeout, or MaxConcurrency calls in flight, is
// Unavailable. Calls go over Forward's own keep-alive pool (at most MaxConcurrency
// connections), on the caller's goroutine, which holds no worker or slot (see the package doc).
type Forward struct {
	client   *fasthttp.HostClient
	url      string
	timeout  time.Duration
	max      int64
	inflight atomic.Int64
	reqHdrs  []string
	upHdrs   [][]byte // canonical
}

// NewForward returns the Forward of o.
func NewForward(o ForwardOptions) (*Forward, error) {
	u, err := url.Parse(o.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
		return nil, fmt.Errorf("auth: forward url %q: must be an http:// or https:// URL", o.URL)
	}
	addr := u.Host
	if u.Port() == "" {
		port := "80"
		if u.Scheme == "https" {
			port = "443"
		}
		addr = net.JoinHostPort(u.Hostname(), port)
	}
	f := &Forward{url: o.URL, timeout: o.Timeout, max: int64(o.MaxConcurrency), reqHdrs: o.RequestHeaders, upHdrs: canonicalNames(o.UpstreamHeaders)}
	if f.timeout <= 0 {
		f.timeout = DefaultForwardTimeout
	}
	if f.max <= 0 {
		f.max = DefaultForwardMaxConcurrency
	}
	f.client = &fasthttp.HostClient{
		Addr:                     addr,
		Name:                     "toron-forward-auth",
		IsTLS:                    u.Scheme == "https",
		MaxConns:                 int(f.max),
		MaxIdleConnDuration:      forwardIdleConnTimeout,
		ReadTimeout:              f.timeout,
		WriteTimeout:             f.timeout,
		MaxResponseBodySize:      ForwardMaxBodyBytes,
		DisablePathNormalizing:   true,
		NoDefaultUserAgentHeader: true,
	}
	return f, nil
}

// Check calls the auth service for the request.
func (f *Forward) Check(in *Input) Verdict {
	if f.inflight.Add(1) > f.max {
		f.inflight.Add(-1)
		return VerdictUnavailable
	}
	defer f.inflight.Add(-1)
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(f.url)
	req.Header.SetMethod(fasthttp.MethodGet)
	h := in.Header
	req.Header.SetBytesV(headerForwardedMethod, h.Method())
	req.Header.Set(headerForwardedProto, in.Scheme)
	req.Header.SetBytesV(headerForwardedHost, h.Host())
	req.Header.SetBytesV(headerForwardedURI, h.RequestURI())
	if in.ClientIP.IsValid() {
		var ip [64]byte
		req.Header.SetBytesV(headerForwardedFor, in.ClientIP.AppendTo(ip[:0]))
	}
	for _, name := range f.reqHdrs {
		if strings.EqualFold(name, fasthttp.HeaderCookie) {
			if c := h.Peek(fasthttp.HeaderCookie); len(c) > 0 {
				req.Header.SetBytesV(fasthttp.HeaderCookie, c)
			}
			continue
		}
		for _, v := range h.PeekAll(name) {
			req.Header.AddBytesV(name, v)
		}
	}
	// An answer without Content-Type must not get fasthttp's default one relayed.
	resp.Header.SetNoDefaultContentType(true)
	if err := f.client.DoTimeout(req, resp, f.timeout); err != nil {
		return VerdictUnavailable
	}
	status := resp.StatusCode()
	if status >= 200 && status < 300 {
		var v Verdict
		for _, name := range f.upHdrs {
			for _, val := range resp.Header.PeekAll(string(name)) {
				v.Upstream = append(v.Upstream, Field{Name: name, Value: append([]byte(nil), val...)})
			}
		}
		return v
	}
	v := Verdict{Outcome: Denied, Status: status, Body: append([]byte(nil), resp.Body()...)}
	for _, name := range relayed {
		if val := resp.Header.Peek(name); len(val) > 0 {
			v.Relay = append(v.Relay, Header{Name: name, Value: string(val)})
		}
	}
	for _, c := range resp.Header.Cookies() {
		v.Relay = append(v.Relay, Header{Name: fasthttp.HeaderSetCookie, Value: string(c)})
	}
	return v
}

// Prepare removes the client's own copies of the upstream headers and sets the auth service's.
// An upstream header appearing several times in the answer is added as many times.
func (f *Forward) Prepare(h *fasthttp.RequestHeader, v *Verdict) {
	setUpstream(h, f.upHdrs, v, true)
}

// Close closes the idle connections to the auth service.
func (f *Forward) Close() { f.client.CloseIdleConnections() }

var _ Checker = (*Forward)(nil)
