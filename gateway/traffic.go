package gateway

import (
	"bytes"
	"strconv"
	"strings"

	"github.com/valyala/fasthttp"

	"toron/conf"
	"toron/streaming"
)

// Traffic rules (SPEC 20): redirect routes and https_only answered at routing (SPEC 3 step 4),
// CORS preflights answered right after Tier 1 (step 5), header rules and CORS headers applied
// after Toron's own headers, and compression of the response stream. A route without rules
// has traffic == nil and pays one pointer test per step.

// trafficRules are one route's rules, compiled when its route table is built.
type trafficRules struct {
	redirect    *conf.Redirect
	httpsOnly   bool
	reqHeaders  *headerOps
	respHeaders *headerOps
	cors        *corsRules
	compress    *streaming.CompressPolicy
}

// corsRules are a cors block with its header values joined once.
type corsRules struct {
	anyOrigin     bool
	credentials   bool
	origins       [][]byte // lower-case
	allowMethods  []byte
	allowHeaders  []byte
	exposeHeaders []byte
	maxAge        []byte // seconds, nil for none
}

// newTrafficRules compiles the route's rules; nil when it has none.
func newTrafficRules(rc *conf.Route) *trafficRules {
	t := rc.Effective.Traffic
	if t == nil {
		return nil
	}
	tr := &trafficRules{redirect: t.Redirect, httpsOnly: t.HTTPSOnly, reqHeaders: newHeaderOps(t.RequestHeaders), respHeaders: newHeaderOps(t.ResponseHeaders)}
	if c := t.CORS; c != nil {
		cr := &corsRules{
			anyOrigin:     c.AnyOrigin(),
			credentials:   c.AllowCredentials,
			allowMethods:  []byte(strings.Join(c.AllowMethods, ", ")),
			allowHeaders:  []byte(strings.Join(c.AllowHeaders, ", ")),
			exposeHeaders: []byte(strings.Join(c.ExposeHeaders, ", ")),
		}
		for _, o := range c.AllowOrigins {
			cr.origins = append(cr.origins, []byte(strings.ToLower(o)))
		}
		if c.MaxAge > 0 {
			cr.maxAge = strconv.AppendInt(nil, int64(c.MaxAge.Seconds()), 10)
		}
		tr.cors = cr
	}
	if c := t.Compress; c != nil {
		p := &streaming.CompressPolicy{MinBytes: c.MinBytes, Types: c.Types}
		for _, name := range c.Encodings {
			if e, ok := streaming.ParseEncoding(name); ok {
				p.Encodings = append(p.Encodings, e)
			}
		}
		tr.compress = p
	}
	return tr
}

// The answers of the traffic rules, given through the rejection path so that a request that
// announced a body is answered without reading it and with Connection: close (handler.go).
// Their status is decided per request (writeTraffic); their reason is none: they are answers,
// not rejections.
var (
	ansRedirect      = &rejection{status: conf.DefaultRedirectStatus, traffic: true}
	ansHTTPSOnly     = &rejection{status: fasthttp.StatusPermanentRedirect, traffic: true}
	ansHTTPSListener = &rejection{status: conf.DefaultRedirectStatus, traffic: true}
	ansPreflight     = &rejection{status: fasthttp.StatusNoContent, traffic: true}
)

// answerAtRouting decides the answers of SPEC 3 step 4: a redirect route, and https_only for a
// request whose scheme is http. It reports whether the request is answered.
func (x *exchange) answerAtRouting(t *trafficRules) bool {
	switch {
	case t.redirect != nil:
		x.reject(ansRedirect)
		x.status = t.redirect.Status
		return true
	case t.httpsOnly && !x.schemeHTTPS():
		x.reject(ansHTTPSOnly)
		return true
	}
	return false
}

// answerPreflight decides the CORS preflight answer (right after SPEC 3 step 5): an OPTIONS
// request with Origin and Access-Control-Request-Method on a route with cors.
func (x *exchange) answerPreflight(h *fasthttp.RequestHeader, t *trafficRules) bool {
	if t.cors == nil || !h.IsOptions() || len(h.PeekCanonical(hdrOrigin)) == 0 || len(h.PeekCanonical(hdrACRequestMethod)) == 0 {
		return false
	}
	x.reject(ansPreflight)
	return true
}

// schemeHTTPS reports whether the request came over https: the listener's scheme, or the
// X-Forwarded-Proto of a trusted proxy (SPEC 16), so that behind a TLS-terminating balancer
// https_only does not redirect forever.
func (x *exchange) schemeHTTPS() bool {
	if x.trustedPeer {
		if v := x.curCtx.Request.Header.PeekBytes(hdrXForwardedProto); len(v) > 0 {
			first, _, _ := bytes.Cut(v, []byte{','})
			return equalFoldLower(bytes.TrimSpace(first), "https")
		}
	}
	return bytes.Equal(x.g.proto, protoHTTPS)
}

// writeTraffic writes the answer of a traffic rule; writeRejection calls it for them.
func (g *Gateway) writeTraffic(ctx *fasthttp.RequestCtx, x *exchange, r *rejection) {
	h := &ctx.Response.Header
	switch r {
	case ansRedirect:
		t := x.route.traffic
		x.status = t.redirect.Status
		x.tbuf = t.redirect.To.Append(x.tbuf[:0], x)
		h.SetBytesKV(hdrLocation, x.tbuf)
	case ansHTTPSOnly:
		x.status = fasthttp.StatusPermanentRedirect
		x.tbuf = x.appendHTTPSLocation(x.tbuf[:0], 0)
		h.SetBytesKV(hdrLocation, x.tbuf)
	case ansHTTPSListener:
		s := &x.snap.cfg.Server
		x.status = s.TLS.HTTPRedirect.Status
		x.tbuf = x.appendHTTPSLocation(x.tbuf[:0], s.Port)
		h.SetBytesKV(hdrLocation, x.tbuf)
	case ansPreflight:
		x.status = fasthttp.StatusNoContent
		x.route.traffic.cors.preflight(h, &ctx.Request.Header)
	}
	h.SetStatusCode(x.status)
	h.SetNoDefaultContentType(true)
	if len(x.reqID) > 0 {
		h.SetBytesKV(headerRequestID, x.reqID)
	}
	if x.bodyAnnounced {
		// Answered from the headers: the body is never read (SPEC 3).
		ctx.SetConnectionClose()
	}
	x.reason = reasonNone
	x.bytesOut = 0
}

// appendHTTPSLocation appends https://host[:port]uri: the request's host without its port, the
// TLS port unless it is 0 or 443, and the URI as received.
func (x *exchange) appendHTTPSLocation(dst []byte, port int) []byte {
	dst = append(dst, "https://"...)
	dst = appendHostOnly(dst, x.curCtx.Request.Header.Host())
	if port != 0 && port != 443 {
		dst = append(dst, ':')
		dst = strconv.AppendInt(dst, int64(port), 10)
	}
	return append(dst, requestURIOf(x.curCtx.Request.Header.RequestURI())...)
}

// appendHostOnly appends the host of a Host value without its port, keeping the brackets of an
// IPv6 literal (it is written into a URL).
func appendHostOnly(dst, host []byte) []byte {
	if len(host) > 0 && host[0] == '[' {
		if end := bytes.IndexByte(host, ']'); end > 0 {
			return append(dst, host[:end+1]...)
		}
		return append(dst, host...)
	}
	if i := bytes.IndexByte(host, ':'); i >= 0 && i == bytes.LastIndexByte(host, ':') {
		host = host[:i]
	}
	return append(dst, host...)
}

// requestURIOf is the origin-form of a request-target: an absolute-form one loses its scheme
// and authority ("http://a/x?q" is "/x?q").
func requestURIOf(uri []byte) []byte {
	if len(uri) > 0 && uri[0] != '/' {
		if i := bytes.Index(uri, []byte("://")); i >= 0 {
			rest := uri[i+3:]
			if j := bytes.IndexAny(rest, "/?"); j >= 0 {
				return rest[j:] // "?q" with an empty path is still a valid reference
			}
			return []byte{'/'}
		}
	}
	return uri
}

// AppendPlaceholder implements conf.TemplateValues for the request in progress.
func (x *exchange) AppendPlaceholder(dst []byte, p conf.Placeholder) []byte {
	h := &x.curCtx.Request.Header
	switch p {
	case conf.PlaceholderHost:
		return appendHostOnly(dst, h.Host())
	case conf.PlaceholderURI:
		return append(dst, requestURIOf(h.RequestURI())...)
	case conf.PlaceholderPath:
		path, _, _ := bytes.Cut(requestURIOf(h.RequestURI()), []byte{'?'})
		return append(dst, path...)
	case conf.PlaceholderQuery:
		_, q, _ := bytes.Cut(h.RequestURI(), []byte{'?'})
		return append(dst, q...)
	case conf.PlaceholderScheme:
		if x.schemeHTTPS() {
			return append(dst, "https"...)
		}
		return append(dst, "http"...)
	case conf.PlaceholderClientIP:
		return x.clientIPOf().AppendTo(dst)
	case conf.PlaceholderRequestID:
		return append(dst, x.reqID...)
	case conf.PlaceholderRoute:
		return append(dst, x.stats.name...)
	}
	return dst
}

// headerOps are a request_headers or response_headers block compiled for the hot path: each
// name in canonical form, so that fasthttp's SetCanonical and PeekCanonical skip the copy and
// normalisation its other setters make per call, and each constant value as bytes, so that
// only a value with a placeholder is expanded per request.
type headerOps struct {
	remove   [][]byte // canonical
	set, add []headerOp
}

// headerOp is one set or add rule.
type headerOp struct {
	name  []byte         // canonical
	value []byte         // the value, when it holds no placeholder (tmpl nil)
	tmpl  *conf.Template // the value, expanded per request
}

// newHeaderOps compiles rules; nil for nil.
func newHeaderOps(rules *conf.HeaderRules) *headerOps {
	if rules == nil {
		return nil
	}
	ops := &headerOps{set: compileHeaderOps(rules.Set), add: compileHeaderOps(rules.Add)}
	for _, name := range rules.Remove {
		ops.remove = append(ops.remove, canonicalHeaderName(name))
	}
	return ops
}

func compileHeaderOps(vals []conf.HeaderValue) []headerOp {
	ops := make([]headerOp, 0, len(vals))
	for i := range vals {
		op := headerOp{name: canonicalHeaderName(vals[i].Name)}
		if lit, ok := vals[i].Value.Literal(); ok {
			op.value = []byte(lit)
		} else {
			op.tmpl = &vals[i].Value
		}
		ops = append(ops, op)
	}
	return ops
}

// canonicalHeaderName is name as fasthttp stores it ("x-env" is "X-Env").
func canonicalHeaderName(name string) []byte {
	return fasthttp.AppendNormalizedHeaderKey(nil, name)
}

// headerEditor is what header rules need of a request or response header.
type headerEditor interface {
	DelBytes(key []byte)
	SetCanonical(key, value []byte)
	AddBytesKV(key, value []byte)
}

// applyHeaderRules applies ops to h: remove, then set, then add (SPEC 20).
func (x *exchange) applyHeaderRules(h headerEditor, ops *headerOps) {
	for _, name := range ops.remove {
		h.DelBytes(name)
	}
	for i := range ops.set {
		op := &ops.set[i]
		h.SetCanonical(op.name, x.headerValue(op))
	}
	for i := range ops.add {
		op := &ops.add[i]
		h.AddBytesKV(op.name, x.headerValue(op))
	}
}

// headerValue is op's value for this request: the constant, or the template expanded into
// x.tbuf (valid until the next expansion).
func (x *exchange) headerValue(op *headerOp) []byte {
	if op.tmpl == nil {
		return op.value
	}
	x.tbuf = op.tmpl.Append(x.tbuf[:0], x)
	return x.tbuf
}

// removesRequestHeader reports whether the route's request_headers remove the client's header
// named k (canonical, as fasthttp parsed it), so that prepareRequest does not copy a header
// only to delete it (a Cookie copied is parsed). applyHeaderRules still removes every name
// afterwards, for the headers Toron sets itself.
func (x *exchange) removesRequestHeader(k []byte) bool {
	t := x.route.traffic
	if t == nil || t.reqHeaders == nil {
		return false
	}
	for _, name := range t.reqHeaders.remove {
		if bytes.Equal(name, k) {
			return true
		}
	}
	return false
}

// applyRequestTraffic edits the request forwarded upstream (after prepareRequest's own headers).
func (x *exchange) applyRequestTraffic(out *fasthttp.RequestHeader) {
	if t := x.route.traffic; t != nil && t.reqHeaders != nil {
		x.applyHeaderRules(out, t.reqHeaders)
	}
}

// applyResponseTraffic edits the response to the client once Toron's own headers are set: CORS
// headers, then the route's response header rules, then the compression decision, which sees
// the final headers. It returns the coding the body is streamed with; contentLength is the
// upstream's declared body length (-1 unknown).
func (x *exchange) applyResponseTraffic(ctx *fasthttp.RequestCtx, contentLength int64) streaming.Encoding {
	t := x.route.traffic
	if t == nil {
		return streaming.Identity
	}
	h := &ctx.Response.Header
	if t.cors != nil {
		t.cors.actual(h, &ctx.Request.Header)
	}
	if t.respHeaders != nil {
		x.applyHeaderRules(h, t.respHeaders)
	}
	if t.compress != nil {
		return t.compress.Apply(&ctx.Request.Header, h, contentLength)
	}
	return streaming.Identity
}

// allowedOrigin returns the value of Access-Control-Allow-Origin for the request's Origin, nil
// when the origin is not allowed.
func (c *corsRules) allowedOrigin(origin []byte) []byte {
	if len(origin) == 0 {
		return nil
	}
	if c.anyOrigin {
		if c.credentials {
			return origin // not reached: conf refuses * with credentials
		}
		return starOrigin
	}
	for _, o := range c.origins {
		if bytes.Equal(o, origin) || equalFold(o, origin) { // browsers send it lower-case
			return origin
		}
	}
	return nil
}

// actual adds the CORS headers of an answer to an allowed origin, and Vary: Origin to every
// answer of the route (the answer depends on the Origin header). The names are canonical
// bytes: SetCanonical and PeekCanonical skip the copy and normalisation of fasthttp's other
// setters.
func (c *corsRules) actual(h *fasthttp.ResponseHeader, req *fasthttp.RequestHeader) {
	if !c.anyOrigin {
		h.AddBytesKV(hdrVary, hdrOrigin)
	}
	allow := c.allowedOrigin(req.PeekCanonical(hdrOrigin))
	if allow == nil {
		return
	}
	if c.anyOrigin {
		h.AddBytesKV(hdrVary, hdrOrigin)
	}
	h.SetCanonical(hdrACAllowOrigin, allow)
	if c.credentials {
		h.SetCanonical(hdrACAllowCredentials, strTrue)
	}
	if len(c.exposeHeaders) > 0 {
		h.SetCanonical(hdrACExposeHeaders, c.exposeHeaders)
	}
}

// preflight writes the headers of a preflight answer: for an allowed origin, the methods,
// headers and max age; for another, none (the browser then refuses the actual request).
func (c *corsRules) preflight(h *fasthttp.ResponseHeader, req *fasthttp.RequestHeader) {
	h.AddBytesKV(hdrVary, preflightVary)
	allow := c.allowedOrigin(req.PeekCanonical(hdrOrigin))
	if allow == nil {
		return
	}
	h.SetCanonical(hdrACAllowOrigin, allow)
	if c.credentials {
		h.SetCanonical(hdrACAllowCredentials, strTrue)
	}
	h.SetCanonical(hdrACAllowMethods, c.allowMethods)
	if len(c.allowHeaders) > 0 {
		h.SetCanonical(hdrACAllowHeaders, c.allowHeaders)
	}
	if c.maxAge != nil {
		h.SetCanonical(hdrACMaxAge, c.maxAge)
	}
}

// The canonical names of the CORS headers, and their constant values.
var (
	hdrVary               = []byte(fasthttp.HeaderVary)
	hdrOrigin             = []byte(fasthttp.HeaderOrigin)
	hdrACRequestMethod    = []byte(fasthttp.HeaderAccessControlRequestMethod)
	hdrACAllowOrigin      = []byte(fasthttp.HeaderAccessControlAllowOrigin)
	hdrACAllowCredentials = []byte(fasthttp.HeaderAccessControlAllowCredentials)
	hdrACAllowMethods     = []byte(fasthttp.HeaderAccessControlAllowMethods)
	hdrACAllowHeaders     = []byte(fasthttp.HeaderAccessControlAllowHeaders)
	hdrACExposeHeaders    = []byte(fasthttp.HeaderAccessControlExposeHeaders)
	hdrACMaxAge           = []byte(fasthttp.HeaderAccessControlMaxAge)
	preflightVary         = []byte("Origin, Access-Control-Request-Method, Access-Control-Request-Headers")
	strTrue               = []byte("true")
)

var (
	hdrLocation = []byte("Location")
	starOrigin  = []byte("*")
)

var _ conf.TemplateValues = (*exchange)(nil)
