package streaming

import (
	"crypto/tls"
	"errors"
	"net"
	"testing"
	"time"

	"toron/internal/testnet"
)

// tlsPair returns both ends of a loopback TLS connection (a certificate of a throwaway CA,
// the handshake done).
func tlsPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	cert := testnet.NewCA(t).Issue(t, "tunnel.test", []string{"tunnel.test"}, time.Now().Add(time.Hour))
	a, b := testnet.Pair(t)
	sc := tls.Server(b, &tls.Config{Certificates: []tls.Certificate{cert}})
	cc := tls.Client(a, &tls.Config{InsecureSkipVerify: true})
	errc := make(chan error, 1)
	go func() { errc <- sc.Handshake() }()
	if err := cc.Handshake(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	return cc, sc
}

// TestTunnelStalledTLSPeer (SPEC 15): a TLS client that stops reading while the upstream sends
// ends the tunnel after WriteTimeout, and the tunnel spends no CPU meanwhile: crypto/tls keeps
// a write deadline's error and returns it from every later Write, which a loop that retried
// the write until the idle timeout turned into a busy loop.
func TestTunnelStalledTLSPeer(t *testing.T) {
	const writeTimeout, idle = 500 * time.Millisecond, 6 * time.Second
	// The client reads for a while first, as a live one does: a write deadline armed while it
	// read would still be ahead when it stops.
	const readFor = idle/2 - 100*time.Millisecond
	client, clientSide := tlsPair(t)
	upstreamSide, upstream := testnet.Pair(t)
	tun := &Tunnel{
		Client:       TunnelEnd{Conn: clientSide},
		Upstream:     TunnelEnd{Conn: upstreamSide},
		IdleTimeout:  idle,
		WriteTimeout: writeTimeout,
	}
	done := make(chan error, 1)
	go func() { done <- tun.Run() }()
	read := make(chan struct{})
	go func() {
		defer close(read)
		buf := make([]byte, 64<<10)
		_ = client.SetReadDeadline(time.Now().Add(readFor))
		for {
			if _, err := client.Read(buf); err != nil {
				return
			}
		}
	}()
	// The upstream floods; the client reads nothing. The upstream's side is paced so that the
	// tunnel's reads keep it from being idle (only the write may end it).
	flood := make([]byte, 16<<10)
	stop := make(chan struct{})
	flooded := make(chan struct{})
	go func() {
		defer close(flooded)
		for {
			select {
			case <-stop:
				return
			default:
			}
			_ = upstream.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
			_, _ = upstream.Write(flood)
		}
	}()
	<-read
	start, cpu0 := time.Now(), testnet.CPUSeconds(t)
	var err error
	select {
	case err = <-done:
	case <-time.After(3 * idle):
		t.Fatal("the stalled tunnel did not end")
	}
	close(stop)
	<-flooded
	wall, cpu := time.Since(start), testnet.CPUSeconds(t)-cpu0
	t.Logf("tunnel ended %s after the client stopped reading: %v; CPU %.3f s, %.3f CPU-s per s", wall.Round(10*time.Millisecond), err, cpu, cpu/wall.Seconds())
	if !errors.Is(err, ErrTunnelStalled) {
		t.Errorf("Run: %v, want ErrTunnelStalled", err)
	}
	if wall > idle-time.Second {
		t.Errorf("ended %s after the stall, want about WriteTimeout %s, well before the idle timeout %s", wall, writeTimeout, idle)
	}
	if per := cpu / wall.Seconds(); per > 0.2 {
		t.Errorf("%.3f CPU-s per s while stalled, want next to none", per)
	}
	_ = client.Close()
}
