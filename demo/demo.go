// Package demo runs the built-in upstream servers of `toron -demo` (SPEC 1): a fast JSON API, a
// slow report service and an upload sink, each a fasthttp server on its own 127.0.0.1 port. They
// exist to show the gateway's features from a terminal, so every answer says what the upstream
// saw: the path, the request id, the body size and hash, the framing of the body.
//
// The servers are plain upstreams with generous, sliding deadlines of their own: in the demo the
// gateway is the one that cuts slow or stalled clients, never the upstream.
package demo

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

const (
	// headerReadTimeout bounds the request line, the headers and fasthttp's pre-read of the first
	// body bytes. Body reads then slide by bodyIdleTimeout (the handler re-arms the deadline).
	headerReadTimeout = 30 * time.Second
	// bodyIdleTimeout is the sliding window for body reads and streamed response writes. It is
	// longer than any demo route's read_timeout (15s at most), so the gateway, not the upstream,
	// is the one that cuts a dripping client, and a 200 MB upload paced by a slow client completes.
	bodyIdleTimeout = 30 * time.Second
	// smallWriteTimeout bounds writing a small JSON answer.
	smallWriteTimeout = 30 * time.Second
	// idleTimeout is how long a keep-alive connection may wait for its next request. It is longer
	// than the gateway's upstream_idle_timeout (30s by default), so the gateway drops an idle
	// pooled connection before this side does and never reuses one already closed here.
	idleTimeout = 90 * time.Second
	// maxBufferedBodyBytes is the largest Content-Length body fasthttp buffers before the handler
	// runs (Server.MaxRequestBodySize). Larger and chunked bodies reach the handler as
	// RequestBodyStream and are read in constant memory; fasthttp does not cap a stream, the
	// gateway's max_body_bytes does.
	maxBufferedBodyBytes = 64 << 10
	// maxIdleWorkerDuration lets fasthttp's worker-pool cleaner, which sleeps this long between
	// rounds, notice a stopped server within a second of Close instead of the default 10s.
	maxIdleWorkerDuration = time.Second
	// closeGrace is how long Close lets busy connections finish after the handlers were told to
	// stop; then it closes them (a client stalled mid-upload, or one not reading a download).
	closeGrace = time.Second
)

// errShuttingDown stops body reads and streamed writes once Close began.
var errShuttingDown = errors.New("demo: upstream is shutting down")

// Upstreams are the demo's built-in upstream servers, each on its own 127.0.0.1 port.
type Upstreams struct {
	// API is the "127.0.0.1:port" of the fast JSON API: any path under /api.
	API string
	// Reports is the "127.0.0.1:port" of the slow report service: /legacy/reports?delay=&size=.
	Reports string
	// Upload is the "127.0.0.1:port" of the upload sink: any path, any body size.
	Upload string
	// API2 is the "127.0.0.1:port" of the second API instance: /api is served by API and API2
	// (SPEC 13), and POST /api/failover stops API2 for 30 s (failover.go).
	API2 string
	// WS is the "127.0.0.1:port" of the WebSocket echo upstream (ws.go).
	WS string
	ws *WSEcho
	// Auth holds the files and credentials of the demo's access-control routes (auth.go).
	Auth *AuthDemo
	// Redis is the demo's own redis-server (redis.go), set by the caller of Start when one runs:
	// the routes then include /api/global and the banner shows it; Close stops it.
	Redis *Redis

	servers []*server
	// done is closed when Close begins: waiting reports and body copies stop at once.
	done chan struct{}
	// reportsWaiting counts report handlers waiting out their delay (tests watch it).
	reportsWaiting atomic.Int64
	wg             sync.WaitGroup

	serveMu   sync.Mutex
	serveErrs []error

	closeOnce sync.Once
	closeErr  error
}

// server is one demo upstream: its fasthttp server and the listener that tracks its connections.
type server struct {
	name string
	srv  *fasthttp.Server
	ln   *trackingListener
}

// Start starts all demo upstreams on 127.0.0.1 with ephemeral ports (":0").
func Start() (*Upstreams, error) {
	u := &Upstreams{done: make(chan struct{})}
	for _, s := range []struct {
		name    string
		addr    *string
		handler fasthttp.RequestHandler
	}{
		{"api", &u.API, u.serveAPI},
		{"reports", &u.Reports, u.serveReports},
		{"upload", &u.Upload, u.serveUpload},
		{instanceAPI2, &u.API2, u.serveAPI},
	} {
		addr, err := u.start(s.name, s.handler)
		if err != nil {
			_ = u.Close()
			return nil, err
		}
		*s.addr = addr
	}
	ws, err := startWSEcho()
	if err != nil {
		_ = u.Close()
		return nil, err
	}
	u.WS, u.ws = ws.Addr(), ws
	if u.Auth, err = newAuthDemo(); err != nil {
		_ = u.Close()
		return nil, err
	}
	return u, nil
}

// start listens on an ephemeral loopback port and serves handler there until Close.
func (u *Upstreams) start(name string, handler fasthttp.RequestHandler) (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("demo: cannot listen for the %s upstream on 127.0.0.1: %w", name, err)
	}
	l = u.wrapListener(name, l)
	ln := &trackingListener{Listener: l, conns: make(map[*trackedConn]struct{})}
	srv := &fasthttp.Server{
		Handler: handler,
		Name:    "toron-demo-" + name,
		// Uploads reach the handler as a stream instead of being buffered whole.
		StreamRequestBody:  true,
		MaxRequestBodySize: maxBufferedBodyBytes,
		// Multipart uploads are hashed as raw bytes like any other body, never parsed.
		DisablePreParseMultipartForm: true,
		ReadTimeout:                  headerReadTimeout,
		WriteTimeout:                 smallWriteTimeout,
		IdleTimeout:                  idleTimeout,
		MaxIdleWorkerDuration:        maxIdleWorkerDuration,
		CloseOnShutdown:              true,
		// A client or gateway that hangs up mid-body is part of the demo, not an error to print
		// over the banner.
		Logger: quietLogger{},
	}
	u.servers = append(u.servers, &server{name: name, srv: srv, ln: ln})
	u.wg.Go(func() {
		if err := srv.Serve(ln); err != nil {
			u.serveMu.Lock()
			u.serveErrs = append(u.serveErrs, fmt.Errorf("demo: %s upstream stopped serving: %w", name, err))
			u.serveMu.Unlock()
		}
	})
	return l.Addr().String(), nil
}

// Close stops every server and waits for their goroutines to end. Waiting reports answer 503 at
// once; a connection still busy after a short grace (a stalled upload or download) is closed.
// Close is safe to call more than once.
func (u *Upstreams) Close() error {
	u.closeOnce.Do(func() {
		close(u.done)

		// fasthttp's Shutdown waits without limit for busy connections; cut them after the grace.
		shutDown := make(chan struct{})
		var cutter sync.WaitGroup
		cutter.Go(func() {
			t := time.NewTimer(closeGrace)
			defer t.Stop()
			select {
			case <-t.C:
				for _, s := range u.servers {
					s.ln.closeConns()
				}
			case <-shutDown:
			}
		})

		var errs []error
		// Close the listeners first: a Shutdown that runs before its Serve goroutine registered
		// the listener returns at once, and that Serve would then accept forever.
		for _, s := range u.servers {
			if err := s.ln.Close(); err != nil {
				errs = append(errs, fmt.Errorf("demo: cannot close the %s listener: %w", s.name, err))
			}
		}
		var shutters sync.WaitGroup
		var errMu sync.Mutex
		for _, s := range u.servers {
			shutters.Go(func() {
				if err := s.srv.Shutdown(); err != nil {
					errMu.Lock()
					errs = append(errs, fmt.Errorf("demo: cannot shut down the %s upstream: %w", s.name, err))
					errMu.Unlock()
				}
			})
		}
		shutters.Wait()
		close(shutDown)
		cutter.Wait()
		u.wg.Wait()
		if u.Auth != nil {
			if err := os.RemoveAll(u.Auth.Dir); err != nil {
				errs = append(errs, fmt.Errorf("demo: cannot remove the auth files: %w", err))
			}
		}
		if u.ws != nil {
			if err := u.ws.Close(); err != nil {
				errs = append(errs, fmt.Errorf("demo: cannot close the ws listener: %w", err))
			}
		}
		if err := u.Redis.Close(); err != nil {
			errs = append(errs, fmt.Errorf("demo: cannot remove the redis-server directory: %w", err))
		}

		u.serveMu.Lock()
		errs = append(errs, u.serveErrs...)
		u.serveMu.Unlock()
		u.closeErr = errors.Join(errs...)
	})
	return u.closeErr
}

// trackingListener remembers the connections it accepted until they are closed, so that Close
// can cut the ones fasthttp's Shutdown would otherwise wait for without limit.
type trackingListener struct {
	net.Listener
	mu    sync.Mutex
	conns map[*trackedConn]struct{}

	closeOnce sync.Once
	closeErr  error
}

// Close closes the listener once; Close and fasthttp's Shutdown both call it.
func (l *trackingListener) Close() error {
	l.closeOnce.Do(func() { l.closeErr = l.Listener.Close() })
	return l.closeErr
}

// Accept accepts the next connection and tracks it until its Close.
func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	tc := &trackedConn{Conn: c, l: l}
	l.mu.Lock()
	l.conns[tc] = struct{}{}
	l.mu.Unlock()
	return tc, nil
}

// closeConns closes every open connection; the server's own Close of each one follows.
func (l *trackingListener) closeConns() { l.closeConnsExcept(nil) }

// closeConnsExcept closes every open connection but keep (nil: none kept).
func (l *trackingListener) closeConnsExcept(keep net.Conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for c := range l.conns {
		if net.Conn(c) != keep {
			_ = c.Conn.Close()
		}
	}
}

// trackedConn is an accepted connection that leaves its listener's set when closed.
type trackedConn struct {
	net.Conn
	l    *trackingListener
	once sync.Once
}

// Close closes the connection and forgets it.
func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.l.mu.Lock()
		delete(c.l.conns, c)
		c.l.mu.Unlock()
	})
	return c.Conn.Close()
}

// quietLogger drops fasthttp's connection-error lines.
type quietLogger struct{}

// Printf discards the message.
func (quietLogger) Printf(string, ...any) {}

var (
	_ net.Listener    = (*trackingListener)(nil)
	_ net.Conn        = (*trackedConn)(nil)
	_ fasthttp.Logger = quietLogger{}
)
