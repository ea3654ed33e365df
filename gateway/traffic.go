package gateway

import (
	"bytes"
	"slices"
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
	tr := &trafficRules{redirect: t.Redirect, httpsOnly: t.HTTPSOnly, reqHeaders: newHeaderOps(t.RequestHeaders, rc.Name, true, ownRequestHeaders)}
	if t.CORS != nil {
		tr.respHeaders = newHeaderOps(t.ResponseHeaders, rc.Name, false, ownResponseHeaders, corsResponseHeader)
	} else {
		tr.respHeaders = newHeaderOps(t.ResponseHeaders, rc.Name, false, ownResponseHeaders)
	}
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

// preflightRoute is the route of an OPTIONS request, matched as i: a CORS preflight (with
// Origin and Access-Control-Request-Method) asks about the actual request, so the route that
// would take that request answers it when it has cors, even when it is restricted to methods
// that do not include OPTIONS. Otherwise the OPTIONS request is routed as any other.
func preflightRoute(snap *snapshot, h *fasthttp.RequestHeader, path []byte, i int) int {
	m := h.PeekCanonical(hdrACRequestMethod)
	if len(m) == 0 || len(h.PeekCanonical(hdrOrigin)) == 0 {
		return i
	}
	if j := snap.table.match(h.Host(), m, path); j >= 0 {
		if t := snap.routes[j].traffic; t != nil && t.cors != nil {
			return j
		}
	}
	return i
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
		return append(dst, x.ipTextOf(x.clientIPOf())...) // the text is made once per connection
	case conf.PlaceholderRequestID:
		return append(dst, x.reqID...)
	case conf.PlaceholderRoute:
		return append(dst, x.stats.name...)
	}
	return dst
}

// headerOps are a request_headers or response_headers block compiled at load for the hot
// path (SPEC 20: remove, then set, then add, after Toron's own headers):
//   - every name in canonical form, so that fasthttp's SetCanonical skips the copy and
//     normalisation its other setters make per call;
//   - each value as bytes when it is constant ({route} is: it is bound to the route's name at
//     load), the per-request value itself when it is one placeholder alone, and a template
//     expanded per request only otherwise;
//   - the removed names split into those only the client (or the upstream) can have sent,
//     dropped while the headers are copied and never deleted afterwards, and those Toron
//     itself may have set by the time the rules run (own), deleted then;
//   - on the request, the set and add rules of the names Toron does not write itself become
//     header lines appended to the request head as it is written (up.Outbound.Extra), the
//     client's fields of a set name being dropped by the copy: no fasthttp call per rule, and
//     a request whose lines are all constant appends the bytes rendered at load.
type headerOps struct {
	skip      [][]byte   // canonical: the names the copy of the headers drops
	removeOwn [][]byte   // canonical: the removed names Toron sets itself, deleted after the copy
	set, add  []headerOp // applied to the fasthttp header
	lines     []lineSeg  // request only: the header lines, in order (the sets, then the adds)
}

// lineSeg is a piece of the request's header lines: bytes rendered at load (whole constant
// lines, then "Name: " of a line whose value is made per request), then that value (op, nil
// for none) and its CRLF.
type lineSeg struct {
	lit []byte
	op  *headerOp
}

// headerOp is one set or add rule.
type headerOp struct {
	name   []byte           // canonical
	value  []byte           // the value, when it is constant (single 0 and tmpl nil)
	single conf.Placeholder // the value is this placeholder alone (tmpl nil)
	tmpl   *conf.Template   // the value, expanded per request
}

// The names Toron writes itself, before the header rules run, on the request it forwards
// (prepareRequest, trace.go; the identity headers of SPEC 16 cannot be named) and on the
// response (proxy); the CORS headers are Toron's too on a route with cors.
var (
	ownRequestHeaders  = [][]byte{headerRequestID, hdrTraceparentCanonical, hdrTracestateCanonical}
	ownResponseHeaders = [][]byte{headerRequestID}
	corsResponseHeader = [][]byte{hdrVary, hdrACAllowOrigin, hdrACAllowCredentials, hdrACExposeHeaders}
)

// newHeaderOps compiles rules for the route named route, where own are the names Toron may
// have set itself before the rules run; lines (the request) renders the rules of the other
// names as header lines. nil for nil.
func newHeaderOps(rules *conf.HeaderRules, route string, lines bool, own ...[][]byte) *headerOps {
	if rules == nil {
		return nil
	}
	isOwn := func(name []byte) bool {
		return slices.ContainsFunc(own, func(list [][]byte) bool { return containsName(list, name) })
	}
	ops := &headerOps{}
	for _, name := range rules.Remove {
		c := canonicalHeaderName(name)
		ops.skip = append(ops.skip, c)
		if isOwn(c) {
			ops.removeOwn = append(ops.removeOwn, c)
		}
	}
	var lit []byte // the constant lines since the last per-request value
	for k, vals := range [][]conf.HeaderValue{rules.Set, rules.Add} {
		for i := range vals {
			op := compileHeaderOp(&vals[i], route)
			switch {
			case !lines || isOwn(op.name):
				if k == 0 {
					ops.set = append(ops.set, op)
				} else {
					ops.add = append(ops.add, op)
				}
				continue
			case k == 0: // a set line replaces the client's fields of the name
				ops.skip = append(ops.skip, op.name)
			}
			if op.value != nil {
				lit = appendRuleLine(lit, op.name, op.value)
				continue
			}
			lit = append(append(lit, op.name...), ':', ' ')
			ops.lines = append(ops.lines, lineSeg{lit: lit, op: &op})
			lit = nil
		}
	}
	if lit != nil {
		ops.lines = append(ops.lines, lineSeg{lit: lit})
	}
	return ops
}

func compileHeaderOp(v *conf.HeaderValue, route string) headerOp {
	op := headerOp{name: canonicalHeaderName(v.Name)}
	tm := v.Value.Bind(conf.PlaceholderRoute, route)
	if lit, ok := tm.Literal(); ok {
		// Never nil: a nil value marks a value made per request. CR and LF cannot be in a
		// value conf accepted; a route's name is cleaned as every per-request value is.
		op.value = appendFieldValue(make([]byte, 0, len(lit)), []byte(lit))
	} else if p, ok := tm.Single(); ok {
		op.single = p
	} else {
		op.tmpl = &tm
	}
	return op
}

// canonicalHeaderName is name as fasthttp stores it ("x-env" is "X-Env").
func canonicalHeaderName(name string) []byte {
	return fasthttp.AppendNormalizedHeaderKey(nil, name)
}

// containsName reports whether names holds the canonical name k.
func containsName(names [][]byte, k []byte) bool {
	for _, name := range names {
		if bytes.Equal(name, k) {
			return true
		}
	}
	return false
}

// appendRuleLine appends the header line "name: v", any CR or LF of v made a space (as
// fasthttp's setters do: a value cannot start a header of its own).
func appendRuleLine(dst, name, v []byte) []byte {
	dst = append(append(dst, name...), ':', ' ')
	return append(appendFieldValue(dst, v), '\r', '\n')
}

// appendFieldValue appends v with any CR or LF made a space.
func appendFieldValue(dst, v []byte) []byte {
	if bytes.IndexByte(v, '\r') < 0 && bytes.IndexByte(v, '\n') < 0 {
		return append(dst, v...)
	}
	for _, c := range v {
		if c == '\r' || c == '\n' {
			c = ' '
		}
		dst = append(dst, c)
	}
	return dst
}

// headerEditor is what header rules need of a request or response header.
type headerEditor interface {
	DelBytes(key []byte)
	SetCanonical(key, value []byte)
	AddBytesKV(key, value []byte)
}

// applyHeaderRules applies the fasthttp part of ops to h, whose copied headers already lack
// the skipped names: remove (Toron's own headers), then set, then add.
func (x *exchange) applyHeaderRules(h headerEditor, ops *headerOps) {
	for _, name := range ops.removeOwn {
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

// headerLines renders the lines of ops for this request: the bytes rendered at load when
// every line is constant, else in x.lines (valid until the next request). A value made of
// the client's bytes ({host}, a template) has any CR or LF made a space; a client IP or a
// request id (printable, setRequestID) cannot hold one.
func (x *exchange) headerLines(ops *headerOps) []byte {
	switch {
	case len(ops.lines) == 0:
		return nil
	case len(ops.lines) == 1 && ops.lines[0].op == nil:
		return ops.lines[0].lit
	}
	b := x.lines[:0]
	for i := range ops.lines {
		seg := &ops.lines[i]
		b = append(b, seg.lit...)
		if op := seg.op; op != nil {
			if v := x.headerValue(op); op.single == conf.PlaceholderClientIP || op.single == conf.PlaceholderRequestID {
				b = append(b, v...)
			} else {
				b = appendFieldValue(b, v)
			}
			b = append(b, '\r', '\n')
		}
	}
	x.lines = b
	return b
}

// headerValue is op's value for this request: the constant, the placeholder's own bytes, or
// the template expanded into x.tbuf (valid until the next expansion).
func (x *exchange) headerValue(op *headerOp) []byte {
	switch {
	case op.tmpl != nil:
		x.tbuf = op.tmpl.Append(x.tbuf[:0], x)
		return x.tbuf
	case op.single == conf.PlaceholderClientIP:
		return x.ipTextOf(x.clientIPOf()) // made once per connection
	case op.single == conf.PlaceholderRequestID:
		return x.reqID
	case op.single != 0:
		x.tbuf = x.AppendPlaceholder(x.tbuf[:0], op.single)
		return x.tbuf
	}
	return op.value
}

// removesRequestHeader reports whether prepareRequest drops the client's header named k
// (canonical, as fasthttp parsed it): the route's request_headers remove it, or set it (the
// line rendered replaces it). A Cookie not copied is not parsed either.
func (x *exchange) removesRequestHeader(k []byte) bool {
	t := x.route.traffic
	return t != nil && t.reqHeaders != nil && containsName(t.reqHeaders.skip, k)
}

// responseRemoves are the names the route's response_headers remove (canonical), which the
// copy of the upstream's headers skips; nil without.
func (x *exchange) responseRemoves() [][]byte {
	if t := x.route.traffic; t != nil && t.respHeaders != nil {
		return t.respHeaders.skip
	}
	return nil
}

// applyRequestTraffic edits the request forwarded upstream (after prepareRequest's own
// headers), and sets the header lines its head is written with (x.out.Extra: nil without).
func (x *exchange) applyRequestTraffic(out *fasthttp.RequestHeader) {
	x.out.Extra = nil
	if t := x.route.traffic; t != nil && t.reqHeaders != nil {
		x.applyHeaderRules(out, t.reqHeaders)
		x.out.Extra = x.headerLines(t.reqHeaders)
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
