// Command toron is the Toron edge gateway: hardened defaults for every connection and per-route
// overrides for legacy workloads that can never starve the rest (see README.md and SPEC.md).
//
// main is wiring only: flags, configuration, logger, signals, start and drain.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"toron/conf"
	"toron/demo"
	"toron/gateway"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// Exit codes of SPEC 1.
const (
	exitOK     = 0
	exitFailed = 1
	exitConfig = 2
)

func main() {
	ensureProcs(os.Getenv, runtime.NumCPU()) // at least 2 Ps on one CPU (procs.go)
	os.Exit(run(os.Args[1:], os.Environ(), os.Stdout, os.Stderr))
}

// options are the command-line flags.
type options struct {
	config, routes string
	check, demo    bool
	version        bool
	watch          bool // -watch, TORON_WATCH: reload when a watched file changes (SPEC 18)
	demoTLS        bool // -demo-tls: demo mode over TLS with a generated certificate
}

func parseFlags(args, environ []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("toron", flag.ContinueOnError)
	// The flag package would print the error and then the whole usage; a mistake gets one line
	// (SPEC 1), from run, and only -h prints the usage.
	fs.SetOutput(io.Discard)
	fs.StringVar(&o.config, "config", envOr(environ, "TORON_CONFIG", "conf/config.yaml"), "server settings file (env TORON_CONFIG)")
	fs.StringVar(&o.routes, "routes", envOr(environ, "TORON_ROUTES", "conf/routes.yaml"), "route table file (env TORON_ROUTES)")
	fs.BoolVar(&o.check, "check", false, "validate both files, print the effective configuration as JSON and exit")
	fs.BoolVar(&o.demo, "demo", false, "start built-in demo upstreams and use the demo route table")
	fs.BoolVar(&o.version, "version", false, "print the version and exit")
	watch, err := envWatch(environ)
	if err != nil {
		return o, err
	}
	fs.BoolVar(&o.watch, "watch", watch, "reload when the config, routes or a certificate file changes, a ConfigMap's ..data swap included (env TORON_WATCH=true|1)")
	fs.BoolVar(&o.demoTLS, "demo-tls", envOr(environ, "TORON_DEMO_TLS", "") == "1", "demo mode over TLS with a self-signed certificate made at start (env TORON_DEMO_TLS=1)")
	err = fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fs.SetOutput(stderr)
		fs.Usage()
	case err != nil:
		err = fmt.Errorf("%w (toron -h lists the flags)", err)
	case fs.NArg() > 0:
		err = fmt.Errorf("unexpected argument %q (toron -h lists the flags)", fs.Arg(0))
	}
	return o, err
}

func envOr(environ []string, key, def string) string {
	for _, kv := range environ {
		if len(kv) > len(key) && kv[:len(key)] == key && kv[len(key)] == '=' {
			return kv[len(key)+1:]
		}
	}
	return def
}

func run(args, environ []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, environ, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		fmt.Fprintf(stderr, "toron: %v\n", err)
		return exitConfig
	}
	if o.version {
		fmt.Fprintf(stdout, "toron %s\n", version)
		return exitOK
	}

	var ups *demo.Upstreams
	// -demo-tls: the demo's config gets a tls block with a certificate made now, in a temporary
	// directory removed at exit (a reload re-reads it from there).
	demoYAML, scheme, demoCertFile := demoConfigYAML, "http", ""
	if o.demoTLS {
		o.demo = true
		dir, err := os.MkdirTemp("", "toron-demo-tls-")
		if err != nil {
			fmt.Fprintf(stderr, "toron: demo certificate: %v\n", err)
			return exitFailed
		}
		defer os.RemoveAll(dir)
		var keyFile string
		demoCertFile, keyFile, err = demo.WriteSelfSignedCert(dir)
		if err != nil {
			fmt.Fprintf(stderr, "toron: demo certificate: %v\n", err)
			return exitFailed
		}
		// SPEC 20: plain http on the redirect port (TORON_DEMO_REDIRECT_PORT, default 8081) is
		// sent to https.
		redirectPort := envOr(environ, "TORON_DEMO_REDIRECT_PORT", "8081")
		demoYAML = append(append([]byte(nil), demoConfigYAML...), fmt.Sprintf("  tls:\n    certs:\n      - {cert_file: %q, key_file: %q}\n    http_redirect: {port: %s}\n", demoCertFile, keyFile, redirectPort)...)
		scheme = "https"
	}
	if o.demo {
		ups, err = demo.Start()
		if err != nil {
			fmt.Fprintf(stderr, "toron: start demo upstreams: %v\n", err)
			return exitFailed
		}
		defer ups.Close()
		// SPEC 17's scope: global, in a redis-server of the demo's own when one is installed.
		if r, err := demo.StartRedis(); err == nil {
			ups.Redis = r
			demoYAML = append(append([]byte(nil), demoYAML...), r.ServerYAML()...)
		} else if !errors.Is(err, demo.ErrNoRedisServer) {
			fmt.Fprintf(stderr, "toron: warning: %v; the demo runs without /api/global\n", err)
		}
	}
	load := func() (*conf.Config, error) {
		if ups != nil {
			return conf.LoadBytes("demo config", demoYAML, "demo routes", ups.RoutesYAML(), environ)
		}
		return conf.Load(o.config, o.routes, environ)
	}
	cfg, err := load()
	if err != nil {
		// One line per error, each saying what is wrong (SPEC 1), so that the first line read,
		// or a log collector's single line, is never a bare header.
		for line := range strings.SplitSeq(strings.TrimSpace(err.Error()), "\n") {
			fmt.Fprintf(stderr, "toron: invalid configuration: %s\n", strings.TrimSpace(line))
		}
		return exitConfig
	}
	for _, w := range cfg.Warnings {
		fmt.Fprintf(stderr, "toron: warning: %s\n", w)
	}
	if o.check {
		for _, w := range checkDiscovered(cfg) {
			fmt.Fprintf(stderr, "toron: warning: %s\n", w)
		}
		out, err := cfg.CheckJSON()
		if err != nil {
			fmt.Fprintf(stderr, "toron: %v\n", err)
			return exitFailed
		}
		fmt.Fprintf(stdout, "%s\n", out)
		return exitOK
	}

	log, level, closeLog, err := newLogger(cfg.Log, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "toron: %v\n", err)
		return exitConfig
	}
	// Every return below, clean stop, signal or error, writes the buffered lines.
	defer closeLog()
	logFormat := cfg.Log.Format // the encoder's, for the life of the process

	// /metrics carries # HELP and # TYPE lines, so that Prometheus types every family
	// (histograms included) instead of ingesting them untyped; the switch is process-wide.
	metrics.ExposeMetadata(true)
	g, err := gateway.New(cfg, log)
	if err != nil {
		fmt.Fprintf(stderr, "toron: %v\n", err)
		return exitFailed
	}
	// Signals are caught before the port opens: a SIGHUP sent as soon as /health answers must
	// reload, not kill the process (its default action).
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(sigs)
	var watcher *conf.Watcher
	var watchChanges <-chan []string // nil without -watch: never ready
	if o.watch {
		if watcher, err = startWatch(o, cfg, log); err != nil {
			fmt.Fprintf(stderr, "toron: %v\n", err)
			return exitFailed
		}
		if watcher != nil {
			defer watcher.Close()
			watchChanges = watcher.Changes()
		}
	}
	ln, err := g.Listen()
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			fmt.Fprintf(stderr, "toron: address %s:%d already in use\n", cfg.Server.Host, cfg.Server.Port)
		} else {
			fmt.Fprintf(stderr, "toron: %v\n", err)
		}
		return exitFailed
	}
	log.Info("listening", zap.String("addr", ln.Addr().String()), zap.Int("routes", len(cfg.Routes)), zap.String("version", version))
	// SPEC 20: server.tls.http_redirect, a plaintext listener redirecting to the TLS one.
	rln, err := g.ListenRedirect()
	if err != nil {
		_ = ln.Close()
		fmt.Fprintf(stderr, "toron: %v\n", err)
		return exitFailed
	}
	if rln != nil {
		log.Info("listening", zap.String("addr", rln.Addr().String()), zap.String("redirects_to", "https"))
		go func() {
			if err := g.ServeRedirect(rln); err != nil {
				log.Error("redirect listener stopped", zap.Error(err))
			}
		}()
	}
	if ups != nil {
		base := scheme + "://" + hostForURL(ln.Addr())
		fmt.Fprint(stdout, ups.Banner(base))
		if demoCertFile != "" {
			fmt.Fprint(stdout, demo.TLSBanner(base, demoCertFile))
		}
		fmt.Fprint(stdout, demo.TracingBanner(base, cfg.Server.Tracing.Endpoint, cfg.Server.Tracing.SampleRatio))
		if rln != nil {
			fmt.Fprint(stdout, demo.RedirectBanner("http://"+hostForURL(rln.Addr()), base))
		}
	}

	serveErr := make(chan error, 1)
	go func() { serveErr <- g.Serve(ln) }()

	for {
		select {
		case err := <-serveErr:
			if err != nil {
				log.Error("server stopped", zap.Error(err))
				fmt.Fprintf(stderr, "toron: %v\n", err)
				return exitFailed
			}
			return exitOK
		case sig := <-sigs:
			if sig == syscall.SIGHUP {
				reload(g, load, log, level, logFormat)
				if watcher != nil {
					watcher.SetPaths(watchedFiles(o, g.Config()))
				}
				continue
			}
			return drain(g, sig, sigs, serveErr, log, func() { reload(g, load, log, level, logFormat) })
		case files := <-watchChanges:
			reloadOnChange(files, watcher, o, g, load, log, level, logFormat) // SIGHUP's path (SPEC 18)
		}
	}
}

// demoConfigYAML keeps the demo on loopback: `make run` must not expose the demo to the network.
var demoConfigYAML = []byte("server:\n  host: 127.0.0.1\n")

// reload re-reads both files; an invalid configuration is logged and the old one keeps serving.
// log.level and log.access change at once; a new log.format takes effect at the next start
// (the encoder is built once, in format), which is logged at each reload that asks for another.
func reload(g *gateway.Gateway, load func() (*conf.Config, error), log *zap.Logger, level zap.AtomicLevel, format string) {
	cfg, err := load()
	if err != nil {
		g.ReloadFailed()
	} else {
		err = g.Reload(cfg)
	}
	if err != nil {
		log.Error("configuration reload refused; the previous configuration keeps serving", zap.Error(err))
		return
	}
	if l, err := zapcore.ParseLevel(cfg.Log.Level); err == nil {
		level.SetLevel(l)
	}
	if cfg.Log.Format != format {
		log.Warn("log.format changes at the next start", zap.String("running", format), zap.String("configured", cfg.Log.Format))
	}
	for _, w := range cfg.Warnings {
		log.Warn("configuration warning", zap.String("warning", w))
	}
	log.Info("configuration reloaded", zap.Int("routes", len(cfg.Routes)))
}

// drain is SPEC 9: /health says draining for drain_delay while requests are still served with
// Connection: close, then the listener closes and in-flight requests get shutdown_timeout to
// finish. A second SIGTERM or SIGINT skips the rest of the delay; a SIGHUP reloads and never
// shortens it (load balancers are still sending while /health says draining).
func drain(g *gateway.Gateway, sig os.Signal, sigs <-chan os.Signal, serveErr <-chan error, log *zap.Logger, onHUP func()) int {
	s := g.Config().Server
	log.Info("draining", zap.String("signal", sig.String()), zap.Duration("drain_delay", s.DrainDelay), zap.Duration("shutdown_timeout", s.ShutdownTimeout))
	g.Drain()
	t := time.NewTimer(s.DrainDelay)
wait:
	for {
		select {
		case <-t.C:
			break wait
		case sig := <-sigs:
			if sig == syscall.SIGHUP {
				onHUP()
				continue
			}
			t.Stop()
			break wait
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.ShutdownTimeout)
	defer cancel()
	if err := g.Shutdown(ctx); err != nil {
		log.Warn("shutdown timeout: closed the remaining connections", zap.Error(err))
	}
	<-serveErr
	log.Info("stopped")
	return exitOK
}

func hostForURL(a net.Addr) string {
	if ta, ok := a.(*net.TCPAddr); ok && ta.IP.IsUnspecified() {
		return fmt.Sprintf("127.0.0.1:%d", ta.Port)
	}
	return a.String()
}

// newLogger builds the zap logger of the log section: JSON or console, at the configured level
// (an AtomicLevel, so that a reload can change it), to stderr through a buffered sink
// (logSink): access lines are written at least every second, other lines at once. closeLog
// writes what is left; call it before exiting.
func newLogger(l conf.Log, w io.Writer) (log *zap.Logger, level zap.AtomicLevel, closeLog func(), err error) {
	parsed, err := zapcore.ParseLevel(l.Level)
	if err != nil {
		return nil, zap.AtomicLevel{}, nil, fmt.Errorf("log.level: %w", err)
	}
	level = zap.NewAtomicLevelAt(parsed)
	sink := gateway.NewLogSink(w, gateway.LogBufferBytes, gateway.LogFlushInterval)
	core := sink.JSONCore(level) // access lines encoded by the gateway in zap's layout
	if l.Format == "console" {
		core = sink.Core(zapcore.NewConsoleEncoder(gateway.JSONEncoderConfig()), level)
	}
	return zap.New(core), level, func() { _ = sink.Close() }, nil
}
