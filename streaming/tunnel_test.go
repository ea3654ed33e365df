package streaming

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"toron/internal/testnet"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type counter struct{ n atomic.Int64 }

func (c *counter) Add(n int) { c.n.Add(int64(n)) }

// tunnelFixture is client <-> [clientSide | Tunnel | upstreamSide] <-> upstream.
type tunnelFixture struct {
	client, upstream net.Conn
	tun              *Tunnel
	up, down         *counter
	done             chan error
}

func startTunnel(t testing.TB, idle time.Duration, clientReader func(net.Conn) io.Reader) *tunnelFixture {
	t.Helper()
	client, clientSide := testnet.Pair(t)
	upstreamSide, upstream := testnet.Pair(t)
	f := &tunnelFixture{client: client, upstream: upstream, up: &counter{}, down: &counter{}, done: make(chan error, 1)}
	var r io.Reader
	if clientReader != nil {
		r = clientReader(clientSide)
	}
	f.tun = &Tunnel{
		Client:      TunnelEnd{Conn: clientSide, Reader: r, Count: f.up},
		Upstream:    TunnelEnd{Conn: upstreamSide, Count: f.down},
		IdleTimeout: idle,
	}
	go func() {
		err := f.tun.Run()
		clientSide.Close()
		upstreamSide.Close()
		f.done <- err
	}()
	return f
}

func (f *tunnelFixture) wait(t testing.TB) error {
	t.Helper()
	return testnet.Ended(t, "the tunnel", 10*time.Second, f.done)
}

// TestTunnelCopiesBothWays: bytes of every size pass byte-exact both ways, a reader with bytes
// buffered before the tunnel is drained first, and the counts add up.
func TestTunnelCopiesBothWays(t *testing.T) {
	f := startTunnel(t, 5*time.Second, func(c net.Conn) io.Reader {
		return io.MultiReader(strings.NewReader("early"), c)
	})
	up := make([]byte, 3<<20)
	down := make([]byte, 2<<20+17)
	_, _ = rand.Read(up)
	_, _ = rand.Read(down)
	gotUp := make(chan []byte, 1)
	go func() { b, _ := io.ReadAll(io.LimitReader(f.upstream, int64(len(up)+5))); gotUp <- b }()
	gotDown := make(chan []byte, 1)
	go func() { b, _ := io.ReadAll(io.LimitReader(f.client, int64(len(down)))); gotDown <- b }()
	go func() {
		for i := 0; i < len(up); {
			n := min(len(up)-i, 1+i%70000) // writes of many sizes
			_, _ = f.client.Write(up[i : i+n])
			i += n
		}
	}()
	_, _ = f.upstream.Write(down)
	if b := <-gotUp; !bytes.Equal(b, append([]byte("early"), up...)) {
		t.Errorf("to upstream: %d bytes, not byte-exact", len(b))
	}
	if b := <-gotDown; !bytes.Equal(b, down) {
		t.Errorf("to client: %d bytes, not byte-exact", len(b))
	}
	f.client.Close()
	if err := f.wait(t); err != nil {
		t.Errorf("Run: %v", err)
	}
	if f.tun.ToUpstream() != int64(len(up)+5) || f.up.n.Load() != f.tun.ToUpstream() || f.tun.ToClient() != int64(len(down)) || f.down.n.Load() != f.tun.ToClient() {
		t.Errorf("counts: %d/%d up, %d/%d down", f.tun.ToUpstream(), f.up.n.Load(), f.tun.ToClient(), f.down.n.Load())
	}
}

// TestTunnelEndsWhenEitherSideCloses: the other side sees the bytes in flight, then the close.
func TestTunnelEndsWhenEitherSideCloses(t *testing.T) {
	for _, side := range []string{"client", "upstream"} {
		t.Run(side, func(t *testing.T) {
			f := startTunnel(t, 5*time.Second, nil)
			closer, other := f.client, f.upstream
			if side == "upstream" {
				closer, other = f.upstream, f.client
			}
			_, _ = closer.Write([]byte("last words"))
			closer.Close()
			_ = other.SetReadDeadline(time.Now().Add(5 * time.Second))
			b, err := io.ReadAll(other)
			if string(b) != "last words" || err != nil {
				t.Errorf("other side read %q, %v", b, err)
			}
			if err := f.wait(t); err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
}

// TestTunnelIdleTimeout: silence both ways ends the tunnel after IdleTimeout; traffic in one
// direction keeps both alive.
func TestTunnelIdleTimeout(t *testing.T) {
	f := startTunnel(t, 500*time.Millisecond, nil)
	start := time.Now()
	for time.Since(start) < 1500*time.Millisecond {
		if _, err := f.client.Write([]byte("k")); err != nil {
			t.Fatal(err)
		}
		b := make([]byte, 1)
		_ = f.upstream.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := io.ReadFull(f.upstream, b); err != nil {
			t.Fatalf("kept alive by traffic, cut after %s: %v", time.Since(start), err)
		}
		time.Sleep(150 * time.Millisecond)
	}
	quiet := time.Now()
	err := f.wait(t)
	if !errors.Is(err, ErrTunnelIdle) {
		t.Errorf("Run: %v, want ErrTunnelIdle", err)
	}
	if d := time.Since(quiet); d < 300*time.Millisecond || d > 5*time.Second {
		t.Errorf("idle tunnel ended %s after the last byte", d)
	}
}

// TestTunnelClose: Close ends a running tunnel at once.
func TestTunnelClose(t *testing.T) {
	f := startTunnel(t, time.Minute, nil)
	time.Sleep(50 * time.Millisecond)
	f.tun.Close()
	_ = f.wait(t)
	_ = f.client.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := f.client.Read(make([]byte, 1)); err == nil {
		t.Error("client connection still open")
	}
}

// BenchmarkTunnelEcho: bytes through a tunnel on loopback and back by an echo.
func BenchmarkTunnelEcho(b *testing.B) {
	f := startTunnel(b, time.Minute, nil)
	go func() {
		buf := make([]byte, 64<<10)
		_, _ = io.CopyBuffer(struct{ io.Writer }{f.upstream}, struct{ io.Reader }{f.upstream}, buf)
	}()
	msg := make([]byte, 64<<10)
	back := make([]byte, len(msg))
	b.SetBytes(int64(len(msg)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := f.client.Write(msg); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(f.client, back); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	f.client.Close()
	_ = f.wait(b)
}
