package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"toron/conf"
	"toron/upstream"
)

// checkLookupTimeout bounds the lookups of -check: all of them run at once.
const checkLookupTimeout = 5 * time.Second

// checkDiscovered resolves every discover: dns entry once for -check (SPEC 13), through
// server.resolver, and fills the entry's Found with the addresses (ip:port) found. A name
// that does not resolve is not an error (DNS may lag a new pod): it comes back as a warning,
// one line per entry.
func checkDiscovered(cfg *conf.Config) []string {
	lookup := upstream.NewDNSLookup(cfg.Server.Resolver)
	ctx, cancel := context.WithTimeout(context.Background(), checkLookupTimeout)
	defer cancel()
	type job struct {
		route string
		t     *conf.EffectiveTarget
		warn  string
	}
	var jobs []*job
	for i := range cfg.Routes {
		r := &cfg.Routes[i]
		for j := range r.Effective.Targets {
			if t := &r.Effective.Targets[j]; t.Discover != "" {
				jobs = append(jobs, &job{route: r.Name, t: t})
			}
		}
	}
	var wg sync.WaitGroup
	for _, jb := range jobs {
		wg.Go(func() {
			found, err := upstream.LookupEntry(ctx, lookup, jb.t.Addr)
			switch {
			case err != nil:
				jb.warn = fmt.Sprintf("route %q: %s (discover: dns) does not resolve: %v; the route answers 503 until it does", jb.route, jb.t.Addr, err)
			case len(found) == 0:
				jb.warn = fmt.Sprintf("route %q: %s (discover: dns) has no address; the route answers 503 until it has one", jb.route, jb.t.Addr)
			}
			jb.t.Found = found
		})
	}
	wg.Wait()
	var warnings []string
	for _, jb := range jobs {
		if jb.warn != "" {
			warnings = append(warnings, jb.warn)
		}
	}
	return warnings
}
