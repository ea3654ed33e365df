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

// dnsEntry is one cached name.
type dnsEntry struct {
	mu      sync.Mutex // held while the name is looked up, so one dial resolves for all
	addrs   []netip.Addr
	expires time.Time
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

	now := r.now()
	e.mu.Lock()
	if e.addrs == nil || !now.Before(e.expires) {
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
			// No stale answer is used: SPEC 13 bounds the cache, and a name that no longer
			// resolves is as good as a refused dial (a failure, retried on another target).
			e.addrs = nil
			e.mu.Unlock()
			return nil, 0, fmt.Errorf("upstream: cannot resolve %s: %w", host, err)
		}
		for i, a := range addrs {
			addrs[i] = a.Unmap()
		}
		e.addrs = addrs
		e.expires = now.Add(r.ttl())
	}
	addrs := e.addrs
	e.mu.Unlock()
	return addrs, int(e.next.Add(1)-1) % len(addrs), nil
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
