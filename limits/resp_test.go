package limits

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"toron/internal/redistest"
	"toron/internal/testnet"
)

// TestParseVerdictStream feeds the reply parser every prefix of a stream of replies: an
// incomplete reply is never taken, a complete one is taken whole, and bytes that are not RESP
// are refused.
func TestParseVerdictStream(t *testing.T) {
	replies := []struct {
		wire string
		want verdictReply
	}{
		{"*2\r\n:1\r\n:0\r\n", verdictReply{ok: true}},
		{"*2\r\n:0\r\n:1500\r\n", verdictReply{wait: 1500}},
		{"-NOSCRIPT No matching script. Please use EVAL.\r\n", verdictReply{err: redisError("NOSCRIPT No matching script. Please use EVAL.")}},
		{"+OK\r\n", verdictReply{err: errBadVerdict}},
		{"*1\r\n*2\r\n$3\r\nabc\r\n:5\r\n", verdictReply{err: errBadVerdict}},
		{"$-1\r\n", verdictReply{err: errBadVerdict}},
		{"*2\r\n$1\r\n1\r\n:0\r\n", verdictReply{err: errBadVerdict}},
	}
	for _, r := range replies {
		for cut := 0; cut < len(r.wire); cut++ {
			if _, n, err := parseVerdict([]byte(r.wire[:cut])); n != 0 || err != nil {
				t.Fatalf("%q cut at %d: took %d bytes (%v), want an incomplete reply", r.wire, cut, n, err)
			}
		}
		got, n, err := parseVerdict([]byte(r.wire + "*2\r\n:1\r\n:0\r\n"))
		if err != nil || n != len(r.wire) || got.ok != r.want.ok || got.wait != r.want.wait || fmt.Sprint(got.err) != fmt.Sprint(r.want.err) {
			t.Fatalf("%q: got %+v n=%d err=%v, want %+v n=%d", r.wire, got, n, err, r.want, len(r.wire))
		}
	}
	for _, bad := range []string{"?x\r\n", "*x\r\n", "$-5\r\n", "\r\n"} {
		if _, _, err := parseVerdict([]byte(bad)); !errors.Is(err, errRedisProtocol) {
			t.Fatalf("%q: err %v, want errRedisProtocol", bad, err)
		}
	}
}

// TestGlobalConcurrentCallersKeepTheirReplies: 64 goroutines share one pipelined connection,
// deciding for keys of limits with bursts 1 to 4; a reply handed to the wrong caller would show
// as a key admitted more or less than its burst.
func TestGlobalConcurrentCallersKeepTheirReplies(t *testing.T) {
	s := redistest.Start(t)
	r := newTestRedis(t, RedisOptions{Addrs: []string{s.Addr}, Timeout: 2 * time.Second})
	var gs []*GlobalLimiter
	for burst := 1; burst <= 4; burst++ {
		gs = append(gs, NewGlobalLimiter(r, 0.001, float64(burst), GlobalOptions{Route: "/c" + strconv.Itoa(burst),
			Local: NewRateLimiter(0.001, float64(burst), 0), OnError: OnErrorDeny}))
	}
	const callers, each = 64, 6
	admitted := make([]int, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			a := netip.AddrFrom4([4]byte{198, 51, 100, byte(i)})
			for range each {
				if ok, _ := gs[i%4].AllowIP(a, time.Now()); ok {
					admitted[i]++
				}
			}
		})
	}
	wg.Wait()
	for i, n := range admitted {
		if n != i%4+1 {
			t.Fatalf("caller %d: %d of %d admitted, want its burst %d (replies mixed up between callers?)", i, n, each, i%4+1)
		}
	}
	if !r.Up() {
		t.Fatal("redis down after the run")
	}
}

// TestGlobalScriptFlushed: a server whose script cache was emptied (a restart, a failover, SCRIPT
// FLUSH) answers NOSCRIPT; the decision is sent again with the script and succeeds.
func TestGlobalScriptFlushed(t *testing.T) {
	s := redistest.Start(t)
	in := newInstance(t, RedisOptions{Addrs: []string{s.Addr}, Timeout: time.Second}, "/n", 0.001, 2, OnErrorDeny)
	a := netip.MustParseAddr("192.0.2.7")
	if ok, _ := in.g.AllowIP(a, time.Now()); !ok {
		t.Fatal("first decision refused")
	}
	if _, err := s.Do("SCRIPT", "FLUSH"); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Do("SCRIPT", "EXISTS", gcraSHA); got != "*1" {
		t.Fatalf("SCRIPT EXISTS after the flush: %q", got)
	}
	if ok, _ := in.g.AllowIP(a, time.Now()); !ok || in.errors.Get() != 0 {
		t.Fatalf("decision after SCRIPT FLUSH: ok=%v errors=%d, want admitted from redis", ok, in.errors.Get())
	}
	if ok, _ := in.g.AllowIP(a, time.Now()); ok || in.errors.Get() != 0 {
		t.Fatalf("third decision: ok=%v errors=%d, want refused by redis (burst 2)", ok, in.errors.Get())
	}
}

// TestGlobalClusterRedirects: the client's map of slots is wrong (every slot on one master) and
// a slot is being migrated: MOVED replies are followed and correct the map, and ASK is answered
// with ASKING at the importing node; no decision fails. The client's slot of a key agrees with
// CLUSTER KEYSLOT.
func TestGlobalClusterRedirects(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	for _, key := range []string{"toron:rl:{/api}:0123456789abcdef", "123456789", "foo", "{user1000}.following", "a{}b", "x{y", "foo{bar}{zap}", "{}{x}"} {
		want, err := cl.Nodes[0].Do("CLUSTER", "KEYSLOT", key)
		if err != nil {
			t.Fatal(err)
		}
		half := len(key) / 2
		if got := ":" + strconv.Itoa(keySlot(key[:half], []byte(key[half:]))); got != want {
			t.Fatalf("slot of %q: %s, CLUSTER KEYSLOT says %s", key, got, want)
		}
	}
	in := newInstance(t, RedisOptions{Addrs: cl.Addrs(), Timeout: time.Second}, "/m", 0.001, 2, OnErrorDeny)
	topo := in.r.topo.Load()
	if topo.single != nil {
		t.Fatal("a cluster taken for a standalone server")
	}
	wrong := topo.slots[0].Load()
	for i := range topo.slots {
		topo.slots[i].Store(wrong)
	}
	slotOf := func(route string) int { return keySlot("toron:rl:{"+route+"}:", nil) }
	for k := range 30 {
		route := "/m" + strconv.Itoa(k)
		g := NewGlobalLimiter(in.r, 0.001, 1, GlobalOptions{Route: route, Local: NewRateLimiter(0.001, 1, 0), OnError: OnErrorDeny, Errors: in.errors})
		a := netip.MustParseAddr("192.0.2.8")
		if ok, _ := g.AllowIP(a, time.Now()); !ok {
			t.Fatalf("route %s: first decision refused (errors %d)", route, in.errors.Get())
		}
		if ok, _ := g.AllowIP(a, time.Now()); ok {
			t.Fatalf("route %s: second decision admitted, burst 1", route)
		}
		owner, err := cl.Nodes[0].Do("CLUSTER", "KEYSLOT", "{"+route+"}")
		if err != nil || owner != ":"+strconv.Itoa(slotOf(route)) {
			t.Fatalf("route %s: CLUSTER KEYSLOT %q %v", route, owner, err)
		}
	}
	if in.errors.Get() != 0 {
		t.Fatalf("%d decisions failed while the map was wrong", in.errors.Get())
	}
	moved := 0
	for i := range topo.slots {
		if topo.slots[i].Load() != wrong {
			moved++
		}
	}
	if moved == 0 {
		t.Fatal("MOVED did not correct the map")
	}

	// ASK: migrate the slot of route /ask from its master to another.
	route := "/ask"
	slot := strconv.Itoa(slotOf(route))
	var src, dst *redistest.Server
	for _, n := range cl.Nodes {
		if _, err := n.Do("EXISTS", "{"+route+"}"); err == nil {
			src = n // the others answer MOVED
		} else if dst == nil {
			dst = n
		}
	}
	if src == nil || dst == nil {
		t.Fatalf("owner of the slot not found (src %v, dst %v)", src, dst)
	}
	id := func(s *redistest.Server) string {
		out, err := s.DoBulk("CLUSTER", "MYID")
		if err != nil || len(out) != 40 {
			t.Fatalf("CLUSTER MYID: %q %v", out, err)
		}
		return out
	}
	if _, err := dst.Do("CLUSTER", "SETSLOT", slot, "IMPORTING", id(src)); err != nil {
		t.Fatal(err)
	}
	if _, err := src.Do("CLUSTER", "SETSLOT", slot, "MIGRATING", id(dst)); err != nil {
		t.Fatal(err)
	}
	g := NewGlobalLimiter(in.r, 0.001, 1, GlobalOptions{Route: route, Local: NewRateLimiter(0.001, 1, 0), OnError: OnErrorDeny, Errors: in.errors})
	if ok, _ := g.AllowIP(netip.MustParseAddr("192.0.2.9"), time.Now()); !ok || in.errors.Get() != 0 {
		t.Fatalf("decision during the migration: ok=%v errors=%d", ok, in.errors.Get())
	}
	if n, _ := dst.Do("CLUSTER", "COUNTKEYSINSLOT", slot); n != ":1" {
		t.Fatalf("importing node holds %s keys of the slot, want :1 (the decision went there with ASKING)", n)
	}
	if n, _ := src.Do("CLUSTER", "COUNTKEYSINSLOT", slot); n != ":0" {
		t.Fatalf("migrating node holds %s keys of the slot, want :0", n)
	}
}

// TestGlobalLateCallerLeavesTheConnection: a call whose deadline passed before it was queued (a
// retry late in its window, a caller descheduled) sends nothing and touches nobody else's call:
// a call in flight behind a busy Redis (DEBUG SLEEP) still gets its reply, the connection lives.
func TestGlobalLateCallerLeavesTheConnection(t *testing.T) {
	s := redistest.Start(t, "--enable-debug-command", "yes")
	r := newTestRedis(t, RedisOptions{Addrs: []string{s.Addr}, Timeout: 2 * time.Second})
	args := []string{"1000", "0"}
	if _, err := r.decide("toron:rl:{/late}:", []byte("warm"), args); err != nil {
		t.Fatal(err)
	}
	p := r.topo.Load().single.conn.Load()
	slept := make(chan error, 1)
	go func() { _, err := s.Do("DEBUG", "SLEEP", "0.3"); slept <- err }()
	time.Sleep(30 * time.Millisecond)
	inFlight := make(chan error, 1)
	go func() { _, err := r.decide("toron:rl:{/late}:", []byte("b"), args); inFlight <- err }()
	time.Sleep(30 * time.Millisecond)
	past := time.Now().Add(-time.Millisecond)
	ctx, cancel := context.WithDeadline(context.Background(), past)
	defer cancel()
	late := p.do(ctx, past, time.Now().UnixNano(), false, scriptCmd{"EVALSHA", gcraSHA, "toron:rl:{/late}:", []byte("late"), args})
	if !errors.Is(late.err, context.DeadlineExceeded) {
		t.Fatalf("late call: %v, want its deadline", late.err)
	}
	if err := <-inFlight; err != nil || p.Dead() || r.fails.Load() != 0 {
		t.Fatalf("the call in flight: %v; connection dead %v (%v); breaker failures %d", err, p.Dead(), p.dead, r.fails.Load())
	}
	if err := <-slept; err != nil {
		t.Fatal(err)
	}
}

// TestGlobalManyCallersShortTimeout: 256 callers with a 10 ms timeout on two cores miss many
// deadlines, and that is all: no connection is killed for it, and every failure is a deadline.
func TestGlobalManyCallersShortTimeout(t *testing.T) {
	s := redistest.Start(t)
	r := newTestRedis(t, RedisOptions{Addrs: []string{s.Addr}, Timeout: 10 * time.Millisecond})
	node := r.topo.Load().single
	first := node.conn.Load()
	var ok, missed atomic.Int64
	other := make(chan error, 1)
	var wg sync.WaitGroup
	end := time.Now().Add(time.Second)
	for i := range 256 {
		wg.Go(func() {
			for time.Now().Before(end) {
				_, err := r.decide("toron:rl:{/many}:", []byte{byte(i), byte(i >> 8)}, []string{"1", "0"})
				switch {
				case err == nil:
					ok.Add(1)
				case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrRedisSkipped):
					missed.Add(1)
					if errors.Is(err, ErrRedisSkipped) {
						time.Sleep(time.Millisecond) // the breaker's pause: do not spin
					}
				default:
					select {
					case other <- err:
					default:
					}
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d decisions from redis, %d missed their 10 ms or were skipped by the breaker", ok.Load(), missed.Load())
	select {
	case err := <-other:
		t.Fatalf("a failure that is not a deadline: %v", err)
	default:
	}
	if node.conn.Load() != first || first.Dead() {
		t.Fatalf("the connection was replaced (dead: %v)", first.dead)
	}
	if ok.Load() == 0 {
		t.Fatal("no decision came from redis")
	}
}

// TestGlobalClusterMasterGone: the map names, for a route's slot, a master that is gone (crashed
// and replaced by a replica at another address): no MOVED can come from it, so a decision that
// finds its node unreachable has the map read again, and decisions come from the cluster again.
func TestGlobalClusterMasterGone(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	in := newInstance(t, RedisOptions{Addrs: cl.Addrs(), Timeout: time.Second}, "/gone", 1000, 1000, OnErrorDeny)
	topo := in.r.topo.Load()
	gone := in.r.node(testnet.RefusedAddr(t))
	topo.slots[keySlot("toron:rl:{/gone}:", nil)].Store(gone)
	if !testnet.WaitUntil(5*time.Second, func() bool {
		_, err := in.r.decide("toron:rl:{/gone}:", []byte("0123456789abcdef"), []string{"1000", "0"})
		return err == nil
	}) {
		t.Fatal("decisions of the slot still fail after 5 s: the map was not read again")
	}
	// The gone address is no longer in the map: its dials stop.
	if !testnet.WaitUntil(5*time.Second, func() bool { return !gone.dialing.Load() }) {
		t.Fatal("the gone master is still being dialed")
	}
}
