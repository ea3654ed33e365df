package gateway

import (
	"bufio"
	"errors"
	"iter"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"toron/conf"
	"toron/limits"
	"toron/socket"
	"toron/streaming"
	up "toron/upstream"
)

// WebSocket tunnels (SPEC 15).
//
// Detection (onHeaders, decide): a GET with Upgrade: websocket, "upgrade" among the Connection
// tokens, Sec-WebSocket-Key and Sec-WebSocket-Version is a WebSocket upgrade; it is routed and
// admitted like any request (bulkhead, elevated budget, worker), plus a slot of the route's
// max_tunnels, taken first. Any other Upgrade, and CONNECT, stay 501 before routing (h2c would
// smuggle a whole HTTP/2 connection past the firewall); a WebSocket upgrade that announces a
// body or lacks a Sec-WebSocket-* header is a 400 (RFC 6455 4.2.1); one on a route without
// websocket: true a 501.
//
// Handshake (the handler, holding its worker): the request goes to the target the route's
// balancer picks, on a new connection that is never pooled (a connection that becomes a tunnel
// can never carry another request), with Upgrade, Connection: Upgrade and Sec-WebSocket-* kept and X-Forwarded-* set by
// prepareRequest, like any forwarded request. Only the upstream's own 101 with Upgrade:
// websocket opens the tunnel; any other answer is relayed as an ordinary response and the
// upstream connection closed.
//
// Tunnel (a hijacked connection): fasthttp applies none of its limits to a hijacked connection
// and its Shutdown does not wait for one, so the tunnel registry here is Toron's own: the 101
// is written, the worker and the bulkhead slot are released, and streaming.Tunnel copies both
// ways until a side closes or the tunnel is idle for tunnel_idle_timeout. The tunnel keeps its
// max_tunnels slot, its toron_tunnels_active count and its client connection, which the
// listener still counts (max_connections, listener.Accept). Shutdown leaves tunnels open
// through drain_delay and closes what is left when shutdown_timeout ends; a reload never
// touches one (it holds its own connections, not the route's pool).

const (
	// tunnelHeadBufferSize bounds the upstream's answer head to a handshake (a 101 is a few
	// hundred bytes); the reader is dropped once the tunnel starts.
	tunnelHeadBufferSize = 4 << 10
	// maxRelayedBodyBytes bounds the body of a non-101 answer to a handshake, which is relayed
	// buffered: an error page, not a download.
	maxRelayedBodyBytes = 1 << 20
)

// Metric names of SPEC 15.
const (
	metricTunnelsActive = "toron_tunnels_active"
	metricTunnelBytes   = "toron_tunnel_bytes_total"
)

var (
	rejBadUpgrade = newRejection(fasthttp.StatusBadRequest, reasonBadRequest,
		"400 Bad Request: a WebSocket upgrade is an HTTP/1.1 request with Sec-WebSocket-Key and Sec-WebSocket-Version and no body", false)
	rejWebSocketOff = newRejection(fasthttp.StatusNotImplemented, reasonBadRequest,
		"501 Not Implemented: WebSocket upgrades are not enabled on this route", false)
	rejTunnelLimit = newRejection(fasthttp.StatusServiceUnavailable, reasonTunnelLimit,
		"503 Service Unavailable: Route tunnel limit reached", true)
	rejUpstreamBadUpgrade = newRejection(fasthttp.StatusBadGateway, reasonUpstreamError,
		"502 Bad Gateway: upstream switched to a protocol other than websocket", false)
)

var (
	hdrUpgrade             = []byte("Upgrade")
	hdrSecWebSocketKey     = []byte("Sec-WebSocket-Key")
	hdrSecWebSocketVersion = []byte("Sec-WebSocket-Version")
	secWebSocketPrefix     = []byte("Sec-WebSocket-")
	tokenWebSocket         = []byte("websocket")
	tokenUpgrade           = []byte("Upgrade")
	tokenUpgradeLower      = []byte("upgrade")
	methodGet              = []byte(fasthttp.MethodGet)
	switchingStatusLine    = []byte("HTTP/1.1 101 Switching Protocols\r\n")
)

// wsState is the WebSocket part of an exchange.
type wsState struct {
	// upgrade marks a WebSocket upgrade request (decide).
	upgrade bool
	// slot is true while the exchange holds a max_tunnels slot of x.route (released by finish
	// unless the tunnel took it).
	slot bool
	// up is the upstream connection of the handshake until the tunnel takes it (finish closes
	// it otherwise).
	up net.Conn
	// head is the 101 to send the client, followed by upstream bytes read past it.
	head []byte
	// headLen is the length of the 101 alone within head.
	headLen int
}

func (w *wsState) reset() { *w = wsState{} }

// release gives back what a handshake held when its exchange finished without a tunnel.
func (w *wsState) release(x *exchange) {
	if w.up != nil {
		_ = w.up.Close()
		w.up = nil
	}
	if w.slot {
		w.slot = false
		x.route.tun.slots.Release()
	}
	w.head = nil
}

// checkUpgrade classifies a request with an Upgrade header (or CONNECT). A WebSocket upgrade
// is marked in x and goes on to routing (true); anything else is rejected here (false).
func checkUpgrade(h *fasthttp.RequestHeader, x *exchange) bool {
	if h.IsConnect() {
		x.reject(rejUpgrade)
		return false
	}
	var conn, upgrade [128]byte
	named, table := up.CollectConnNames(conn[:0], h.PeekAll(fasthttp.HeaderConnection))
	defer up.ReleaseConnTable(table)
	upTokens := appendHeaderValues(upgrade[:0], h.All(), hdrUpgrade)
	if !isOnlyToken(upTokens, tokenWebSocket) {
		// h2c, TLS/1.0, a list of protocols: Toron speaks none of them (SPEC 11).
		x.reject(rejUpgrade)
		return false
	}
	// RFC 6455 4.1 and 4.2.1: a handshake has no body, both headers, and is HTTP/1.1.
	if x.bodyAnnounced || len(h.PeekBytes(hdrSecWebSocketKey)) == 0 || len(h.PeekBytes(hdrSecWebSocketVersion)) == 0 || !h.IsHTTP11() {
		x.reject(rejBadUpgrade)
		return false
	}
	if !equalFold(h.Method(), methodGet) || !named.Has(tokenUpgradeLower) {
		x.reject(rejUpgrade)
		return false
	}
	x.ws.upgrade = true
	return true
}

// appendHeaderValues appends the values of every line of header k among a header's lines
// (a request's or a response's All), comma-separated.
func appendHeaderValues(dst []byte, lines iter.Seq2[[]byte, []byte], k []byte) []byte {
	for name, v := range lines {
		if equalFold(name, k) {
			dst = append(dst, v...)
			dst = append(dst, ',')
		}
	}
	return dst
}

// isOnlyToken reports whether the comma-separated list holds tok (case-insensitive) and nothing
// else (empty elements aside, RFC 9110 5.6.1).
func isOnlyToken(list, tok []byte) bool {
	found := false
	for len(list) > 0 {
		var t []byte
		t, list, _ = cutByte(list, ',')
		t = trimOWS(t)
		switch {
		case len(t) == 0:
		case equalFold(t, tok) && !found:
			found = true
		default:
			return false
		}
	}
	return found
}

func cutByte(b []byte, sep byte) (before, after []byte, found bool) {
	for i, c := range b {
		if c == sep {
			return b[:i], b[i+1:], true
		}
	}
	return b, nil, false
}

// admitTunnel is admission for a WebSocket upgrade: a max_tunnels slot, taken with the route's
// bulkhead (SPEC 15), then the admission of any request.
func (g *Gateway) admitTunnel(x *exchange) {
	tun := x.route.tun
	if !tun.slots.TryAcquire() {
		x.reject(rejTunnelLimit)
		return
	}
	x.ws.slot = true
	if err := g.admit(x); err != nil {
		x.ws.slot = false
		tun.slots.Release()
		x.reject(admissionRejection(err))
	}
}

// tunnel runs the handshake of an admitted WebSocket upgrade on the handler's goroutine (it
// holds its worker until the 101), then hijacks the connection for the tunnel.
func (g *Gateway) tunnel(ctx *fasthttp.RequestCtx, cc *clientConn, x *exchange) {
	r := x.route
	eff := &r.eff
	// The balancer picks the target (SPEC 13); the tunnel counts in its in-flight requests
	// until it ends (exchange.finish gives the outcome: the handshake's answer, or a failed
	// dial's 502).
	ip := x.clientIPOf().As16()
	x.upTarget = r.set.Pick(ip[:])
	if x.upTarget == nil {
		// DNS discovery found no address: nothing to dial.
		g.writeRejection(ctx, x, rejNoTarget)
		x.finish()
		return
	}
	x.upAddr, x.upStatus = x.upTarget.Addr(), fasthttp.StatusBadGateway
	x.trace.StartAttempt(x.method, x.upAddr) // the handshake is the tunnel's one attempt (trace.go)
	uc, err := g.dialTunnel(r, x.upTarget)
	if err != nil {
		x.AttemptEnd(err, nil)
		g.writeRejection(ctx, x, upstreamRejection(err))
		x.finish()
		return
	}
	x.ws.up = uc // the exchange owns it until the tunnel takes it: finish closes it

	req := fasthttp.AcquireRequest()
	g.prepareRequest(ctx, x, req)
	// The one exception to the hop-by-hop rule (SPEC 15): the upgrade itself goes upstream.
	req.Header.SetBytesKV(hdrUpgrade, tokenWebSocket)
	req.Header.SetBytesKV(hdrConnectionName, tokenUpgrade)
	_ = uc.SetWriteDeadline(time.Now().Add(eff.WriteTimeout))
	head := req.Header.Header()
	if len(x.out.Extra) > 0 { // request_headers' lines (traffic.go)
		head = up.AppendRequestHead(nil, &req.Header, x.out.Extra)
	}
	_, err = uc.Write(head)
	fasthttp.ReleaseRequest(req)
	if err != nil {
		g.writeRejection(ctx, x, upstreamRejection(err))
		x.finish()
		return
	}

	start := time.Now()
	_ = uc.SetReadDeadline(start.Add(eff.ResponseHeaderTimeout))
	br := headReaderPool.Get().(*bufio.Reader)
	br.Reset(uc)
	defer func() {
		br.Reset(nil)
		headReaderPool.Put(br)
	}()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	resp.Header.SetNoDefaultContentType(true)
	resp.Header.DisableNormalizing() // the 101 goes on as the upstream wrote it
	err = resp.ReadLimitBody(br, maxRelayedBodyBytes)
	x.headerWait = time.Since(start)
	x.AttemptEnd(err, resp)
	if err == nil {
		x.upStatus = resp.StatusCode()
	} else if socket.IsTimeout(err) {
		x.upStatus = fasthttp.StatusGatewayTimeout
	}
	if err != nil {
		rej := upstreamRejection(err)
		if errors.Is(err, fasthttp.ErrBodyTooLarge) {
			rej = rejUpstreamBad
		}
		g.writeRejection(ctx, x, rej)
		x.finish()
		return
	}
	if resp.StatusCode() != fasthttp.StatusSwitchingProtocols {
		// The upstream refused the upgrade (a 403, a 426): an ordinary answer, no tunnel.
		up.CopyResponseHeaders(&ctx.Response.Header, &resp.Header)
		ctx.Response.Header.SetStatusCode(resp.StatusCode())
		ctx.Response.Header.SetBytesKV(headerRequestID, x.reqID)
		ctx.Response.SetBody(resp.Body())
		x.status = resp.StatusCode()
		x.bytesOut = int64(len(resp.Body()))
		x.finish() // closes the upstream connection
		return
	}
	var upTokens [64]byte
	if !isOnlyToken(appendHeaderValues(upTokens[:0], resp.Header.All(), hdrUpgrade), tokenWebSocket) {
		g.writeRejection(ctx, x, rejUpstreamBadUpgrade)
		x.finish()
		return
	}

	x.ws.head = appendSwitchingHead(x.ws.head[:0], &resp.Header, x.reqID)
	x.ws.headLen = len(x.ws.head)
	if n := br.Buffered(); n > 0 {
		// Frames the upstream sent right behind its 101 are the client's first bytes.
		b, _ := br.Peek(n)
		x.ws.head = append(x.ws.head, b...)
	}
	_ = uc.SetDeadline(time.Time{})
	// Until the hijack handler runs no status is recorded: if fasthttp never starts it (the
	// socket closed meanwhile), clientConn.Close finishes the exchange as a client that left.
	x.status = 0
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(c net.Conn) { g.runTunnel(c, cc, x) })
}

var headReaderPool = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, tunnelHeadBufferSize) }}

// appendSwitchingHead appends the 101 sent to the client: the upstream's end-to-end headers,
// its Sec-WebSocket-* headers whatever its Connection says, Upgrade: websocket, Connection:
// Upgrade and the request id.
func appendSwitchingHead(dst []byte, h *fasthttp.ResponseHeader, reqID []byte) []byte {
	dst = append(dst, switchingStatusLine...)
	var stack [128]byte
	named, table := up.CollectConnNames(stack[:0], h.PeekAll(fasthttp.HeaderConnection))
	defer up.ReleaseConnTable(table)
	for k, v := range h.All() {
		sec := len(k) > len(secWebSocketPrefix) && equalFold(k[:len(secWebSocketPrefix)], secWebSocketPrefix)
		if !sec && (up.IsHopByHop(k) || named.Has(k) || equalFold(k, hdrContentLength) || equalFold(k, headerRequestID)) {
			continue
		}
		dst = appendHeaderLine(dst, k, v)
	}
	dst = appendHeaderLine(dst, hdrUpgrade, tokenWebSocket)
	dst = appendHeaderLine(dst, hdrConnectionName, tokenUpgrade)
	dst = appendHeaderLine(dst, headerRequestID, reqID)
	return append(dst, '\r', '\n')
}

func appendHeaderLine(dst, k, v []byte) []byte {
	dst = append(dst, k...)
	dst = append(dst, ':', ' ')
	dst = append(dst, v...)
	return append(dst, '\r', '\n')
}

// dialTunnel opens the tunnel's own upstream connection to target t, as the target's
// pool dials (DNS through the gateway's resolver, the route's TLS settings for an https target
// under the target's own name, the handshake inside connect_timeout), but never pooled.
func (g *Gateway) dialTunnel(r *route, t *up.Target) (net.Conn, error) {
	// A discovered address is verified under its entry's host name (SPEC 13), as its pool is.
	name := net.JoinHostPort(t.ServerName(), "0")
	return up.Dial(g.resolver.Dial, t.Addr(), up.TargetTLS(r.tls, r.conf.TLSServerName, name), r.eff.ConnectTimeout)
}

// runTunnel is the hijack handler: it sends the 101 (and the upstream bytes behind it), hands
// the worker and the bulkhead slot back, and copies until the tunnel ends. fasthttp closes the
// client connection when it returns.
func (g *Gateway) runTunnel(c net.Conn, cc *clientConn, x *exchange) {
	x.status = fasthttp.StatusSwitchingProtocols
	if err := cc.flushPending(); err != nil {
		x.status, x.reason = statusClientClosed, reasonClientAbort
		x.finish()
		return
	}
	raw := cc.Conn // below clientConn's sliding write window: the tunnel has its own deadlines
	_ = raw.SetWriteDeadline(time.Now().Add(x.route.eff.WriteTimeout))
	_, err := raw.Write(x.ws.head)
	_ = raw.SetWriteDeadline(time.Time{})
	early := int64(len(x.ws.head) - x.ws.headLen)
	x.ws.head = nil
	if err != nil {
		x.status, x.reason = statusClientClosed, reasonClientAbort
		x.finish()
		return
	}
	t := g.tunnels.open(x)
	if t == nil {
		// The shutdown already closed every tunnel.
		return
	}
	defer g.tunnels.end(t)
	st := t.stats
	st.toClient.Add(int(early))
	t.early = early
	t.t = streaming.Tunnel{
		Client:      streaming.TunnelEnd{Conn: raw, Reader: c, Count: st.toUpstream},
		Upstream:    streaming.TunnelEnd{Conn: t.up, Count: st.toClient},
		IdleTimeout: x.route.eff.TunnelIdleTimeout,
		// SPEC 15: a side that takes no byte of a pending write for write_timeout ends the
		// tunnel, toward the client as toward the upstream.
		WriteTimeout: x.route.eff.WriteTimeout,
	}
	if !g.tunnels.start(t) {
		return
	}
	t.err = t.t.Run()
}

// tunnelStats is what belongs to a route name across reloads: the max_tunnels slots and the
// tunnel metrics.
type tunnelStats struct {
	slots      *limits.Bulkhead
	toUpstream *metrics.Counter
	toClient   *metrics.Counter
}

// liveTunnel is one open tunnel.
type liveTunnel struct {
	x     *exchange
	stats *tunnelStats
	up    net.Conn
	t     streaming.Tunnel
	early int64 // upstream bytes sent to the client with the 101
	err   error
}

// tunnelRegistry knows every open tunnel, for the shutdown, and the tunnel stats of every
// route name.
type tunnelRegistry struct {
	g   *Gateway
	set *metrics.Set

	mu      sync.Mutex
	byName  map[string]*tunnelStats
	live    map[*liveTunnel]struct{}
	running map[*liveTunnel]bool // started copying: Close applies
	closed  bool
	wg      sync.WaitGroup
	count   atomic.Int64 // open tunnels, read by every accept
}

func newTunnelRegistry(g *Gateway, set *metrics.Set) *tunnelRegistry {
	return &tunnelRegistry{g: g, set: set, byName: make(map[string]*tunnelStats), live: make(map[*liveTunnel]struct{}), running: make(map[*liveTunnel]bool)}
}

// stats returns the tunnel stats of a websocket route (nil for other routes), creating them
// and their metrics on first use; the route's max_tunnels is applied with the table
// (applyTunnelLimit).
func (tr *tunnelRegistry) stats(rc *conf.Route) *tunnelStats {
	if !rc.Effective.Websocket {
		return nil
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if s := tr.byName[rc.Name]; s != nil {
		return s
	}
	label := `{route=` + quoteLabel(rc.Name)
	s := &tunnelStats{slots: limits.NewBulkhead(rc.Effective.MaxTunnels)}
	s.toUpstream = tr.set.GetOrCreateCounter(metricTunnelBytes + label + `,direction="to_upstream"}`)
	s.toClient = tr.set.GetOrCreateCounter(metricTunnelBytes + label + `,direction="to_client"}`)
	slots := s.slots
	tr.set.GetOrCreateGauge(metricTunnelsActive+label+`}`, func() float64 { return float64(slots.InFlight()) })
	tr.byName[rc.Name] = s
	return s
}

// applyTunnelLimit puts the route's max_tunnels in force (a reload may change it; open
// tunnels stay open).
func (r *route) applyTunnelLimit() {
	if r.tun != nil {
		r.tun.slots.SetMax(r.eff.MaxTunnels)
	}
}

// open turns the handshake's exchange into a tunnel once the 101 was sent: the request is
// counted (code 101, its handshake duration), its worker, elevated budget and bulkhead slot
// are released, and the tunnel takes the upstream connection and the max_tunnels slot. It
// returns nil, with everything released, when the registry was closed by a shutdown.
func (tr *tunnelRegistry) open(x *exchange) *liveTunnel {
	if !x.active.CompareAndSwap(true, false) {
		panic("BUG: gateway: tunnel opened for a finished exchange")
	}
	x.releaseAdmission()
	x.endTrace(time.Now()) // SPEC 21: a tunnel is traced up to its 101
	st := x.stats
	st.codeCounter(x.status).Inc()
	st.duration.UpdateDuration(x.start)
	if x.headerWait > 0 {
		st.headerWait.Update(x.headerWait.Seconds())
	}
	t := &liveTunnel{x: x, stats: x.route.tun, up: x.ws.up}
	x.ws.up, x.ws.slot = nil, false
	tr.mu.Lock()
	closed := tr.closed
	if !closed {
		tr.live[t] = struct{}{}
		tr.wg.Add(1)
		tr.count.Add(1)
	}
	tr.mu.Unlock()
	if closed {
		_ = t.up.Close()
		t.stats.slots.Release()
		x.doneTarget()
		return nil
	}
	return t
}

// start marks the tunnel as copying, so that a shutdown closes it; false when the shutdown
// came first.
func (tr *tunnelRegistry) start(t *liveTunnel) bool {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.closed {
		return false
	}
	tr.running[t] = true
	return true
}

// end releases a tunnel that stopped copying and writes its access line.
func (tr *tunnelRegistry) end(t *liveTunnel) {
	_ = t.up.Close()
	t.stats.slots.Release()
	tr.mu.Lock()
	delete(tr.live, t)
	delete(tr.running, t)
	tr.mu.Unlock()
	tr.count.Add(-1)
	x := t.x
	x.doneTarget()
	x.bytesIn = t.t.ToUpstream()
	x.bytesOut = t.t.ToClient() + t.early
	if tr.g.access.Load() {
		tr.g.logTunnel(x, t.err)
	}
	tr.wg.Done()
}

// refuse reports whether a new client connection must be refused because the open ones,
// tunnels included, reach max_connections. fasthttp refuses beyond Concurrency itself but no
// longer counts a hijacked connection; without tunnels its own check is left alone.
func (tr *tunnelRegistry) refuse(open int64) bool {
	return tr.count.Load() > 0 && open >= int64(tr.g.snap.Load().cfg.Server.MaxConnections)
}

// closeAll ends every open tunnel and waits until they are gone (the end of a shutdown); no
// tunnel opens after it.
func (tr *tunnelRegistry) closeAll() {
	tr.mu.Lock()
	tr.closed = true
	for t := range tr.running {
		t.t.Close()
	}
	tr.mu.Unlock()
	tr.wg.Wait()
}

// logTunnel writes the access line of a tunnel when it ends (SPEC 15): status 101, its whole
// duration and the bytes of both directions.
func (g *Gateway) logTunnel(x *exchange, err error) {
	ce := g.log.Check(zap.InfoLevel, "tunnel")
	if ce == nil {
		return
	}
	end := "closed"
	switch {
	case errors.Is(err, streaming.ErrTunnelIdle):
		end = "idle_timeout"
	case errors.Is(err, streaming.ErrTunnelStalled):
		end = "write_timeout"
	case err != nil:
		end = "error"
	}
	fields := []zap.Field{
		zap.String("request_id", string(x.reqID)),
		zap.String("route", x.stats.name),
		zap.String("method", string(x.method)),
		zap.String("path", string(x.path)),
		zap.Int("status", fasthttp.StatusSwitchingProtocols),
		zap.Int64("bytes_in", x.bytesIn),
		zap.Int64("bytes_out", x.bytesOut),
		zap.Duration("duration", time.Since(x.start)),
		zap.Duration("upstream_header_wait", x.headerWait),
		zap.String("tunnel_end", end),
		zap.String("remote", x.conn.RemoteAddr().String()),
		zap.String("target", x.upAddr),
		zap.String("client_ip", x.clientIPOf().String()),
	}
	if x.trace.Active() {
		fields = append(fields, zap.String("trace_id", string(x.trace.AppendTraceID(nil))))
	}
	ce.Write(fields...)
}
