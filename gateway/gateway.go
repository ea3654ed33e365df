// Package gateway is Toron's request path: the fasthttp server and its hooks, the route table,
// admission, forwarding to upstreams, the error-to-status mapping, metrics and the access log.
// It reads top to bottom in the order of SPEC 3; the leaves (limits, timeouts, streaming) know
// nothing of configuration or logging.
package gateway

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"toron/conf"
	"toron/limits"
	"toron/tracing"
	up "toron/upstream"
)

// Gateway is one running Toron: a fasthttp server, the route table in force and the admission
// state that outlives route tables (bulkheads, worker pool, elevated budget, metrics).
type Gateway struct {
	log    *zap.Logger
	access atomic.Bool
	// accessJSON is the log's core when access lines are encoded here (accessline.go).
	accessJSON *flushCore

	srv *fasthttp.Server
	ln  atomic.Pointer[listener] // set by Serve, read by Shutdown and the metrics
	// shut is set by Shutdown: a Serve that stores its listener after Shutdown looked for it
	// closes it itself (fasthttp's Shutdown ends only the Serve calls it already knows).
	shut atomic.Bool

	snap atomic.Pointer[snapshot]

	workers *limits.WorkerPool
	budget  *limits.Bulkhead

	set      *metrics.Set
	stats    *statsRegistry
	none     *routeStats
	reloads  *metrics.Counter
	reloadKO *metrics.Counter

	// resolver dials every upstream, resolving DNS names at dial time (SPEC 13);
	// onUpstreamEvent logs the targets' health changes.
	resolver        up.Resolver
	onUpstreamEvent func(up.Event)

	draining atomic.Bool
	reqSeq   atomic.Uint64
	idPrefix string

	tunnels *tunnelRegistry // open WebSocket tunnels (tunnel.go)
	tracers tracers         // the OpenTelemetry tracer in force (trace.go)
	// TLS on the listener (tls.go) and X-Forwarded-Proto ("https" on a TLS listener).
	tls   tlsState
	proto []byte
	// redir is the HTTPS redirect listener of server.tls.http_redirect (redirect.go).
	redir redirectState
}

// snapshot is one immutable route table with the configuration it came from. A request keeps
// the snapshot it was admitted under, so a reload never moves an in-flight request.
type snapshot struct {
	cfg         *conf.Config
	table       *routeTable
	routes      []*route
	healthPath  []byte
	metricsPath []byte
	trusted     trustedSet // server.trusted_proxies (clientip.go)
	// redis is the client of server.redis, nil without it; a reload that keeps server.redis
	// keeps the client (ratelimit.go, redisOf).
	redis *limits.Redis
}

// route is a configured route with its runtime parts.
type route struct {
	conf   *conf.Route
	server *conf.Server
	name   string
	eff    conf.Effective
	stats  *routeStats
	// set is the route's targets and balancer (SPEC 13); each target carries its connection
	// pool (up.Pool) as its attached value.
	set *up.Set
	// host is the Host of a request that came without one (HTTP/1.0): the first target's
	// host:port, as nginx's proxy_pass names its upstream.
	host string
	// tls is the route's upstream TLS configuration (up.TLSConfig), nil for http targets.
	tls *tls.Config
	// rl is the route's rate_limit, nil without one (ratelimit.go).
	rl *routeRateLimit
	// ac is the route's access control, nil without access or auth (access.go).
	ac *routeAuth

	// rw is the route's path rewriting (rewrite.go); tun its tunnel state, nil without
	// websocket: true (tunnel.go).
	rw  rewrite
	tun *tunnelStats
	// traffic is the route's SPEC 20 rules (traffic.go), nil without any. A redirect route
	// has no set: it is answered at routing.
	traffic *trafficRules
}

// closeIdle closes the idle upstream connections of every target of the route.
func (r *route) closeIdle() {
	if r.set == nil {
		return // a redirect route has no targets
	}
	for _, t := range r.set.Targets() {
		// A closed Set (shutdown, or a route that left the table) has closed its pools.
		if p, ok := t.Attached().(*up.Pool); ok {
			p.CloseIdle()
		}
	}
}

// New builds a gateway for cfg. It does not listen yet: call Serve or ListenAndServe.
func New(cfg *conf.Config, log *zap.Logger) (*Gateway, error) {
	if log == nil {
		log = zap.NewNop()
	}
	set := metrics.NewSet()
	g := &Gateway{
		log:        log,
		accessJSON: accessJSONCore(log),
		workers:    limits.NewWorkerPool(cfg.Server.WorkerPoolSize),
		budget:     limits.NewBulkhead(cfg.ElevatedBudget()),
		set:        set,
		stats:      newStatsRegistry(set),
		idPrefix:   newIDPrefix(),
	}
	g.resolver.Dialer.KeepAlive = 30 * time.Second
	g.onUpstreamEvent = logUpstreamEvent(log)
	g.access.Store(cfg.Log.Access)
	g.tunnels = newTunnelRegistry(g, set)
	g.none = g.stats.get(noRoute)
	g.reloads = set.NewCounter(metricReloads)
	g.reloadKO = set.NewCounter(metricReloadErrors)
	tracing.DroppedCounter(set) // at 0 with tracing off, so its alert has a series
	set.NewGauge(metricRedisUp, func() float64 {
		if r := g.snap.Load().redis; r != nil && r.Up() {
			return 1
		}
		return 0
	})
	set.NewGauge(metricWorkersBusy, func() float64 { return float64(g.workers.Busy()) })
	set.NewGauge(metricWorkersMax, func() float64 { return float64(g.workers.Size()) })
	set.NewGauge(metricElevatedInflight, func() float64 { return float64(g.budget.InFlight()) })
	set.NewGauge(metricConnectionsOpen, func() float64 {
		if l := g.ln.Load(); l != nil {
			return float64(l.open.Load())
		}
		return 0
	})

	snap, err := g.buildSnapshot(cfg, nil)
	if err != nil {
		return nil, err
	}
	// The snapshot is put in force here, once, on the caller's goroutine: Serve must not store
	// it again, or a reload handled between New and Serve (a SIGHUP during startup) would be
	// overwritten by the configuration it replaced.
	g.applySnapshot(snap)
	if err := g.newTLSState(cfg); err != nil {
		return nil, err
	}

	g.srv = g.newServer(&cfg.Server)
	// Last: nothing after it can fail, so a tracer's export goroutine never outlives a New
	// that returned an error.
	if err := g.setTracing(cfg.Server.Tracing); err != nil {
		return nil, err
	}
	return g, nil
}

// newServer returns a fasthttp server with the gateway's hooks and settings: the main
// listener's, and the HTTPS redirect listener's (redirect.go), which has the same defences.
func (g *Gateway) newServer(s *conf.Server) *fasthttp.Server {
	return &fasthttp.Server{
		Handler:        g.handle,
		HeaderReceived: g.onHeaders,
		ExpectHandler:  g.onExpect,
		ErrorHandler:   g.onError,
		// Concurrency counts connections, not requests (SPEC 12): the request-level bound is our
		// worker pool.
		Concurrency: s.MaxConnections,
		// The read buffer bounds the request line and headers: above it fasthttp reports
		// ErrSmallBuffer, answered 431.
		ReadBufferSize: int(s.MaxHeaderBytes),
		// The header and idle deadlines are armed by onConnState from the configuration in
		// force, so that a reload changes them; body reads and all writes slide in clientConn.
		// fasthttp's own timeouts are off: they are fixed at startup, and its WriteTimeout would
		// be absolute for a whole response.
		ReadTimeout:       0,
		IdleTimeout:       0,
		WriteTimeout:      0,
		ConnState:         g.onConnState,
		StreamRequestBody: true,
		// An idle keep-alive connection gives its write buffer and body buffers back to
		// fasthttp's pools while it waits (SPEC 22); its read buffer fasthttp keeps whenever
		// StreamRequestBody is on (server.go: "we cannot safely release br"), and Toron's own
		// per-request state goes back to exchangePool (conn.go).
		ReduceMemoryUsage:            true,
		DisablePreParseMultipartForm: true,
		NoDefaultServerHeader:        true,
		NoDefaultContentType:         true,
		CloseOnShutdown:              true,
		// Toron never asks for ctx.Time(): its requests' clock is read once, when a connection
		// goes active (onConnState). Lazy, fasthttp skips its own read per request (issue 32:
		// clock reads were 3.5% of a bulkhead 503's gateway samples).
		LazyRequestTime: true,
		Logger:          fasthttpLogger{g.log},
	}
}

// checkSnapshot reports what buildSnapshot would refuse in cfg, building nothing: the trusted
// proxies, each route's upstream TLS settings and its upstream Set.
func (g *Gateway) checkSnapshot(cfg *conf.Config) error {
	if _, err := newTrustedSet(cfg); err != nil {
		return err
	}
	for i := range cfg.Routes {
		rc := &cfg.Routes[i]
		if rc.Type == conf.RouteTypeRedirect {
			continue // no targets, no Set (buildSnapshot)
		}
		tlsCfg, err := upstreamTLSConfig(rc)
		if err != nil {
			return err
		}
		uc := upstreamConfig(rc, g.set, g.resolver.Dial, tlsCfg, g.onUpstreamEvent, nil, nil)
		if err := uc.Validate(); err != nil {
			return fmt.Errorf("gateway: route %q: %w", rc.Name, err)
		}
	}
	return nil
}

// buildSnapshot turns a validated configuration into a route table with upstream pools. prev,
// when not nil, is the snapshot in force: a route that keeps its name keeps its targets' state
// (health, in-flight counts) and, when their settings did not change, their connection pools.
func (g *Gateway) buildSnapshot(cfg *conf.Config, prev *snapshot) (*snapshot, error) {
	snap := &snapshot{
		cfg:         cfg,
		healthPath:  []byte(cfg.Server.HealthPath),
		metricsPath: []byte(cfg.Server.MetricsPath),
	}
	var err error
	if snap.trusted, err = newTrustedSet(cfg); err != nil {
		return nil, err
	}
	if snap.redis, err = redisOf(cfg, prev); err != nil {
		return nil, err
	}
	built := false
	if snap.redis != nil && (prev == nil || prev.redis != snap.redis) {
		// A client made for this snapshot is closed when the snapshot fails to build.
		defer func() {
			if !built {
				snap.redis.Close()
			}
		}()
	}
	// Auth first: its checkers read files (htpasswd, JWKS) and may fail, and the Sets below
	// take over the serving routes' targets, which cannot be undone (SPEC 18).
	acs, err := g.buildAuth(cfg, prev)
	if err != nil {
		return nil, err
	}
	defer func() {
		if !built { // a step below failed: the checkers made above are not used
			made := make([]*route, len(acs))
			for i := range made {
				made[i] = &route{ac: acs[i]}
			}
			closeAuth(made, prev)
		}
	}()
	old := map[string]*route{}
	if prev != nil {
		for _, r := range prev.routes {
			old[r.name] = r
		}
	}
	entries := make([]tableEntry, len(cfg.Routes))
	// discover: dns entries are resolved through server.resolver (SPEC 13).
	lookup := up.NewDNSLookup(cfg.Server.Resolver)
	for i := range cfg.Routes {
		rc := &cfg.Routes[i]
		entries[i] = tableEntry{Host: rc.Host, Prefix: rc.Prefix, Methods: rc.Methods}
		if rc.Type == conf.RouteTypeRedirect {
			// Answered at routing (SPEC 20): no targets, no pools, no upstream state.
			st := g.stats.get(rc.Name)
			snap.routes = append(snap.routes, &route{name: rc.Name, eff: rc.Effective, stats: st, conf: rc, server: &cfg.Server, traffic: newTrafficRules(rc), ac: acs[i]})
			continue
		}
		var prevSet *up.Set
		if o := old[rc.Name]; o != nil {
			prevSet = o.set
		}
		tlsCfg, err := upstreamTLSConfig(rc)
		if err != nil {
			return nil, err
		}
		// The checks verify each target under its own host unless tls_server_name names one
		// (package upstream fills an empty ServerName with the target's host).
		var checkTLS *tls.Config
		if tlsCfg != nil {
			checkTLS = tlsCfg.Clone()
			checkTLS.ServerName = rc.TLSServerName
		}
		// A target new to the route gets its pool before it can be picked: at NewSet, and when
		// DNS discovery finds an address (on the discovery goroutine).
		attach := func(t *up.Target) {
			pp := targetPoolParams(rc, &cfg.Server, tlsCfg, t)
			t.Attach(up.NewPool(pp, g.resolver.Dial, limits.NewWorkerPool(pp.MaxConns)))
		}
		set, err := up.NewSet(upstreamConfig(rc, g.set, g.resolver.Dial, checkTLS, g.onUpstreamEvent, lookup, attach), prevSet)
		if err != nil {
			return nil, fmt.Errorf("gateway: route %q: %w", rc.Name, err)
		}
		for _, t := range set.Targets() {
			pp := targetPoolParams(rc, &cfg.Server, tlsCfg, t)
			cur, _ := t.Attached().(*up.Pool)
			if cur != nil && cur.Params() == pp {
				continue
			}
			// A new target, or settings that changed: a new pool; the old one's connections
			// close as their requests end.
			t.Attach(up.NewPool(pp, g.resolver.Dial, limits.NewWorkerPool(pp.MaxConns)))
			if cur != nil {
				cur.Retire()
			}
		}
		st := g.stats.get(rc.Name)
		// The configured first entry: a discovered one may have no address at the moment.
		rt := &route{name: rc.Name, eff: rc.Effective, stats: st, set: set, conf: rc, server: &cfg.Server, host: rc.Effective.Targets[0].Addr}
		rt.rl = g.rateLimitOf(rc, st, snap.redis)
		rt.rw, rt.tun = newRewrite(rc), g.tunnels.stats(rc)
		rt.tls = tlsCfg
		rt.traffic = newTrafficRules(rc)
		rt.ac = acs[i]
		snap.routes = append(snap.routes, rt)
	}
	snap.table = newRouteTable(entries)
	built = true
	return snap, nil
}

// applySnapshot puts a snapshot in force: bulkhead sizes first, then the table.
func (g *Gateway) applySnapshot(snap *snapshot) {
	for _, r := range snap.routes {
		r.stats.bulkhead.SetMax(r.eff.MaxConcurrency)
		r.rl.apply()
		r.applyTunnelLimit()
	}
	g.budget.SetMax(snap.cfg.ElevatedBudget())
	g.snap.Store(snap)
}

// Config returns the configuration in force.
func (g *Gateway) Config() *conf.Config { return g.snap.Load().cfg }

// Reload validates cfg against the configuration in force and swaps the route table
// atomically. In-flight requests finish on the route they started on; a route that keeps its
// name keeps its bulkhead count. On error the old configuration keeps serving.
func (g *Gateway) Reload(cfg *conf.Config) error {
	if err := cfg.ReloadCompatible(g.Config()); err != nil {
		g.reloadKO.Inc()
		return err
	}
	// SPEC 18: every step is checked before any is taken, so that a reload that fails leaves
	// the old configuration serving, whole: building the snapshot hands the routes' targets
	// over to the new table and retires pools, and reloadTLS swaps the certificates, neither
	// of which can be undone.
	if err := g.checkTLSReload(cfg); err != nil {
		g.reloadKO.Inc()
		return err
	}
	if err := g.checkSnapshot(cfg); err != nil {
		g.reloadKO.Inc()
		return err
	}
	old := g.snap.Load()
	snap, err := g.buildSnapshot(cfg, old)
	if err != nil {
		// Checked above: only a step that checkSnapshot does not know can fail here.
		g.reloadKO.Inc()
		return err
	}
	if err := g.reloadTLS(cfg); err != nil {
		panic("BUG: gateway: TLS reload failed after its check: " + err.Error())
	}
	if err := g.setTracing(cfg.Server.Tracing); err != nil {
		// conf checked the endpoint; building an exporter dials nothing. Should it fail all
		// the same, the tracer in force keeps exporting: a reload is not refused for traces.
		g.log.Error("reload: tracing keeps its previous settings", zap.Error(err))
	}
	g.access.Store(cfg.Log.Access)
	g.applySnapshot(snap)
	closeAuth(old.routes, snap) // the checkers the new table did not keep (access.go)
	g.reloads.Inc()
	// A route that left the table ends its targets: checkers stop, pools retire (requests
	// admitted under the old table finish on their connections, which then close). The Sets of
	// routes that stayed were taken over by the new ones.
	kept := map[string]bool{}
	for _, r := range snap.routes {
		if r.set != nil {
			kept[r.name] = true
		}
	}
	for _, r := range old.routes {
		if !kept[r.name] && r.set != nil {
			r.set.Close()
		}
	}
	// A changed server.redis got a new client; decisions still waiting on the old one end at
	// its close and follow on_error.
	if old.redis != nil && old.redis != snap.redis {
		old.redis.Close()
	}
	return nil
}

// ReloadFailed counts a reload whose configuration could not even be loaded (the files were
// invalid): toron_config_reload_errors_total counts every refused reload.
func (g *Gateway) ReloadFailed() { g.reloadKO.Inc() }

// Listen opens the configured listener.
func (g *Gateway) Listen() (net.Listener, error) {
	s := g.Config().Server
	addr := net.JoinHostPort(s.Host, strconv.Itoa(s.Port))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("gateway: listen on %s: %w", addr, err)
	}
	return ln, nil
}

// Serve serves client connections from ln until Shutdown.
func (g *Gateway) Serve(ln net.Listener) error {
	ln = g.proxyProtocol(ln) // below TLS: the PROXY header comes first (proxyproto.go)
	ln, err := g.wrapTLS(ln)
	if err != nil {
		return err
	}
	l := newListener(ln, g)
	g.ln.Store(l)
	if g.shut.Load() {
		_ = l.Close() // Shutdown came first: Serve returns at its first Accept
	}
	return g.srv.Serve(l)
}

// Drain starts the drain of SPEC 9: /health answers 503 draining and every response carries
// Connection: close, so load balancers take the instance out while it still serves.
func (g *Gateway) Drain() { g.draining.Store(true) }

// Draining reports whether Drain was called.
func (g *Gateway) Draining() bool { return g.draining.Load() }

// Shutdown closes the listener and waits for in-flight requests until ctx is done; whatever is
// still open then is closed. It returns ctx's error when requests had to be cut.
func (g *Gateway) Shutdown(ctx context.Context) error {
	g.Drain()
	g.shut.Store(true)
	// The HTTPS redirect listener closes with this one (SPEC 20, redirect.go).
	redirDone := make(chan error, 1)
	go func() { redirDone <- g.shutdownRedirect(ctx) }()
	err := g.srv.ShutdownWithContext(ctx)
	if rerr := <-redirDone; err == nil {
		err = rerr
	}
	l := g.ln.Load()
	if l != nil {
		// Closed already when fasthttp knew it; else a Serve that stored it before shut was
		// set has not reached fasthttp yet, and returns at its first Accept.
		_ = l.Close()
	}
	if err == nil && l != nil {
		// fasthttp no longer counts a hijacked connection (an HTTP/1.0 client's body of
		// unknown length, streamToHTTP10); the listener still does, until its close.
		err = l.waitClosed(ctx)
	}
	if err != nil && l != nil {
		l.closeAll()
	}
	// Tunnels were left open until now (SPEC 15); what is left ends here, its goroutines
	// waited for.
	g.tunnels.closeAll()
	// The targets' health checkers stop and their pools close their idle connections; a
	// connection still lent closes when its request ends.
	snap := g.snap.Load()
	for _, r := range snap.routes {
		if r.set != nil {
			r.set.Close()
		}
	}
	closeAuth(snap.routes, nil) // JWKS refreshes stop, auth-service connections close
	if snap.redis != nil {
		snap.redis.Close()
	}
	g.shutdownTracing(ctx) // the spans still queued, once no request can end another
	return err
}

// Metrics returns the gateway's metric set (what /metrics serves).
func (g *Gateway) Metrics() *metrics.Set { return g.set }

// fasthttpLogger sends fasthttp's own messages to zap at debug level: they are about single
// connections, and each request already has its access line.
type fasthttpLogger struct{ log *zap.Logger }

func (l fasthttpLogger) Printf(format string, args ...any) {
	if ce := l.log.Check(zap.DebugLevel, "fasthttp"); ce != nil {
		ce.Write(zap.String("msg", fmt.Sprintf(format, args...)))
	}
}
