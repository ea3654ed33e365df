package upstream

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// MaxDNSCacheTTL is the longest a resolved name is reused (SPEC 13): long enough that dials do
// not wait on DNS, short enough that a Kubernetes Service or a rolled DNS record is followed
// within half a minute. Go's resolver does not expose record TTLs, so this is a fixed bound.
const MaxDNSCacheTTL = 30 * time.Second

// Resolver dials host:port targets, resolving a DNS name when a connection is dialed (SPEC 13)
// and caching the answer for at most TTL. Successive dials to a name with several addresses go
// round-robin over them, so new connections spread; a dial that fails on one address tries the
// next ones while ctx lasts. IP literals are dialed as they are. The zero value is ready to use.
type Resolver struct {
	// TTL is how long an answer is reused, at most MaxDNSCacheTTL; 0 means MaxDNSCacheTTL.
	TTL time.Duration
	// Lookup resolves a host name; nil is net.DefaultResolver.LookupNetIP(ctx, "ip", host).
	Lookup func(ctx context.Context, host string) ([]netip.Addr, error)
	// Dialer dials each address; the zero value is net.Dialer's defaults (bound by ctx).
	Dialer net.Dialer
	// Clock is the cache's time source; nil is time.Now.
	Clock func() time.Time

	mu    sync.Mutex
	names map[string]*dnsEntry
}

// dnsEntry is one cached name. One lookup at a time refreshes it; the dials that need it
// meanwhile wait for that lookup or for their own context, whichever ends first.
type dnsEntry struct {
	mu      sync.Mutex
	addrs   []netip.Addr
	expires time.Time
	err     error         // the last lookup's error, for the dials that waited on it
	pending chan struct{} // closed when the lookup under way ends; nil when none is
	next    atomic.Uint32
}

// Dial connects to addr (host:port) before ctx is done. It is a DialFunc.
func (r *Resolver) Dial(ctx context.Context, addr string) (net.Conn, error) {
	host, portText, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("upstream: cannot dial %q: %w", addr, err)
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return r.Dialer.DialContext(ctx, "tcp", addr)
	}
	port, err := strconv.ParseUint(portText, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("upstream: cannot dial %q: bad port", addr)
	}
	addrs, start, err := r.resolve(ctx, host)
	if err != nil {
		return nil, err
	}
	var last error
	for i := range addrs {
		a := addrs[(start+i)%len(addrs)]
		conn, err := r.Dialer.DialContext(ctx, "tcp", netip.AddrPortFrom(a, uint16(port)).String())
		if err == nil {
			return conn, nil
		}
		last = err
		if ctx.Err() != nil {
			break
		}
	}
	return nil, last
}

// DialTimeout is Dial with a timeout, in the shape of fasthttp.DialFuncWithTimeout.
func (r *Resolver) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return r.Dial(ctx, addr)
}

// errNoAddresses is a name that resolved to nothing.
var errNoAddresses = errors.New("upstream: host name has no addresses")

// resolve returns the addresses of host, from the cache while it is fresh, and where this dial
// starts among them.
func (r *Resolver) resolve(ctx context.Context, host string) ([]netip.Addr, int, error) {
	r.mu.Lock()
	if r.names == nil {
		r.names = make(map[string]*dnsEntry)
	}
	e := r.names[host]
	if e == nil {
		e = &dnsEntry{}
		r.names[host] = e
	}
	r.mu.Unlock()

	for {
		now := r.now()
		e.mu.Lock()
		if e.addrs != nil && now.Before(e.expires) {
			addrs := e.addrs
			e.mu.Unlock()
			return addrs, int(e.next.Add(1)-1) % len(addrs), nil
		}
		if wait := e.pending; wait != nil {
			e.mu.Unlock()
			select {
			case <-wait:
			case <-ctx.Done():
				return nil, 0, fmt.Errorf("upstream: cannot resolve %s: %w", host, ctx.Err())
			}
			e.mu.Lock()
			err := e.err
			e.mu.Unlock()
			if err != nil {
				return nil, 0, err
			}
			continue
		}
		e.pending = make(chan struct{})
		e.mu.Unlock()
		addrs, err := r.lookup(ctx, host)
		e.mu.Lock()
		if err != nil {
			// No stale answer is used: SPEC 13 bounds the cache, and a name that no longer
			// resolves is as good as a refused dial (a failure, retried on another target).
			e.addrs, e.err = nil, err
		} else {
			e.addrs, e.err, e.expires = addrs, nil, now.Add(r.ttl())
		}
		close(e.pending)
		e.pending = nil
		e.mu.Unlock()
		if err != nil {
			return nil, 0, err
		}
	}
}

// lookup resolves host once, IPv4-mapped answers unmapped.
func (r *Resolver) lookup(ctx context.Context, host string) ([]netip.Addr, error) {
	lookup := r.Lookup
	if lookup == nil {
		lookup = func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		}
	}
	addrs, err := lookup(ctx, host)
	if err == nil && len(addrs) == 0 {
		err = errNoAddresses
	}
	if err != nil {
		return nil, fmt.Errorf("upstream: cannot resolve %s: %w", host, err)
	}
	out := make([]netip.Addr, len(addrs))
	for i, a := range addrs {
		out[i] = a.Unmap()
	}
	return out, nil
}

// ttl is the effective cache time.
func (r *Resolver) ttl() time.Duration {
	if r.TTL <= 0 || r.TTL > MaxDNSCacheTTL {
		return MaxDNSCacheTTL
	}
	return r.TTL
}

// now is the cache's time.
func (r *Resolver) now() time.Time {
	if r.Clock != nil {
		return r.Clock()
	}
	return time.Now()
}

var _ DialFunc = (*Resolver)(nil).Dial
