package upstream

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"toron/internal/testnet"
)

// acceptOn listens on ip:port and counts the connections it accepts.
func acceptOn(t *testing.T, ip string, port int) (*atomic.Int64, int) {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
	if err != nil {
		t.Skipf("cannot listen on %s: %v", ip, err)
	}
	var n atomic.Int64
	testnet.Serve(t, ln, func(net.Conn) { n.Add(1) })
	return &n, ln.Addr().(*net.TCPAddr).Port
}

// dialOnce dials addr through r and closes the connection; a failed dial fails the test.
func dialOnce(t *testing.T, r *Resolver, addr string) {
	t.Helper()
	c, err := r.Dial(context.Background(), addr)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	c.Close()
}

func TestResolverLocalhost(t *testing.T) {
	v4, port := acceptOn(t, "127.0.0.1", 0)
	addrs, err := net.DefaultResolver.LookupNetIP(context.Background(), "ip", "localhost")
	if err != nil {
		t.Fatal(err)
	}
	// Where localhost also has ::1, listen there too (same port): new connections must then
	// go to both.
	var v6 *atomic.Int64
	for _, a := range addrs {
		if a.Is6() && !a.Is4In6() {
			if ln, err := net.Listen("tcp", net.JoinHostPort("::1", strconv.Itoa(port))); err == nil {
				ln.Close()
				v6, _ = acceptOn(t, "::1", port)
			}
		}
	}
	var r Resolver
	for range 6 {
		dialOnce(t, &r, "localhost:"+strconv.Itoa(port))
	}
	total := func() int64 {
		if v6 == nil {
			return v4.Load()
		}
		return v4.Load() + v6.Load()
	}
	testnet.Eventually(t, "6 connections", func() bool { return total() == 6 })
	if v6 != nil && (v4.Load() == 0 || v6.Load() == 0) {
		t.Fatalf("localhost has %v: connections %d on 127.0.0.1 and %d on ::1, want both used", addrs, v4.Load(), v6.Load())
	}
	t.Logf("localhost is %v; 127.0.0.1 got %d of 6 connections", addrs, v4.Load())
}

func TestResolverSpreadsOverAddresses(t *testing.T) {
	// Two real listeners on the same port of two loopback addresses, one name for both.
	one, port := acceptOn(t, "127.0.0.1", 0)
	two, _ := acceptOn(t, "127.0.0.2", port)
	var lookups atomic.Int64
	clock := newFakeClock()
	r := &Resolver{
		Clock: clock.Now,
		Lookup: func(ctx context.Context, host string) ([]netip.Addr, error) {
			lookups.Add(1)
			if host != "api.internal" {
				return nil, errors.New("no such host")
			}
			return []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::ffff:127.0.0.2")}, nil
		},
	}
	addr := "api.internal:" + strconv.Itoa(port)
	for range 10 {
		dialOnce(t, r, addr)
	}
	testnet.Eventually(t, "10 connections", func() bool { return one.Load()+two.Load() == 10 })
	if one.Load() != 5 || two.Load() != 5 {
		t.Fatalf("connections %d and %d, want 5 on each address", one.Load(), two.Load())
	}
	if lookups.Load() != 1 {
		t.Fatalf("%d lookups for 10 dials within the TTL, want 1", lookups.Load())
	}
	clock.Advance(MaxDNSCacheTTL)
	dialOnce(t, r, addr)
	if lookups.Load() != 2 {
		t.Fatalf("the name was not resolved again after %s", MaxDNSCacheTTL)
	}
	if _, err := r.Dial(context.Background(), "nowhere.internal:80"); err == nil {
		t.Fatal("a name that does not resolve dialed")
	}
}

func TestResolverFailsOverToNextAddress(t *testing.T) {
	hits, port := acceptOn(t, "127.0.0.2", 0)
	r := &Resolver{Lookup: func(ctx context.Context, host string) ([]netip.Addr, error) {
		// 127.0.0.3 has no listener on the port: refused.
		return []netip.Addr{netip.MustParseAddr("127.0.0.3"), netip.MustParseAddr("127.0.0.2")}, nil
	}}
	for range 4 {
		dialOnce(t, r, "svc:"+strconv.Itoa(port))
	}
	testnet.Eventually(t, "every dial reached the listening address", func() bool { return hits.Load() == 4 })
}

func TestResolverIPLiteralNotResolved(t *testing.T) {
	hits, port := acceptOn(t, "127.0.0.1", 0)
	r := &Resolver{Lookup: func(ctx context.Context, host string) ([]netip.Addr, error) {
		t.Errorf("IP literal %s was looked up", host)
		return nil, errors.New("no")
	}}
	c, err := r.DialTimeout("127.0.0.1:"+strconv.Itoa(port), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	testnet.Eventually(t, "one connection", func() bool { return hits.Load() == 1 })
}

func TestResolverWaitBoundedByDialContext(t *testing.T) {
	hits, port := acceptOn(t, "127.0.0.1", 0)
	release := make(chan struct{})
	var lookups atomic.Int64
	r := &Resolver{Lookup: func(ctx context.Context, host string) ([]netip.Addr, error) {
		lookups.Add(1)
		<-release // a slow DNS server
		return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
	}}
	addr := "slow.internal:" + strconv.Itoa(port)
	first := make(chan error, 1)
	go func() {
		c, err := r.Dial(context.Background(), addr)
		if err == nil {
			c.Close()
		}
		first <- err
	}()
	testnet.Eventually(t, "the first lookup is under way", func() bool { return lookups.Load() == 1 })
	// A second dial with a short deadline waits for the same lookup, but not past its deadline.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := r.Dial(ctx, addr); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second dial: %v, want its deadline", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("second dial waited %s behind a slow lookup", d)
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	dialOnce(t, r, addr)
	if lookups.Load() != 1 {
		t.Fatalf("%d lookups, want 1 shared by every dial", lookups.Load())
	}
	testnet.Eventually(t, "two connections", func() bool { return hits.Load() == 2 })
}
