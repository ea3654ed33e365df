package gateway

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

// uploadAndReadAll sends the headers of a 1 MiB POST to path and 200 KiB of its body, then
// 1 KiB every 50 ms (an upload still under way), while it reads everything the gateway sends
// until it closes. It returns the bytes and the read error: a clean close is nil, a reset is
// ECONNRESET.
func uploadAndReadAll(t *testing.T, addr, path string) ([]byte, error) {
	t.Helper()
	c := dialRaw(t, addr)
	head := "POST " + path + " HTTP/1.1\r\nHost: a\r\nContent-Length: 1048576\r\n\r\n"
	body := strings.Repeat("x", 200<<10)
	stop := make(chan struct{})
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		if _, err := io.WriteString(c, head+body); err != nil {
			return
		}
		more := []byte(strings.Repeat("y", 1<<10))
		for sent := len(body); sent+len(more) < 1<<20; sent += len(more) {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			if _, err := c.Write(more); err != nil {
				return
			}
		}
	}()
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	got, err := io.ReadAll(c)
	close(stop)
	<-wrote
	return got, err
}

// checkWholeAnswer asserts that the client read a whole response with the given status and a
// body starting with prefix, and then a clean end of the connection, not a reset.
func checkWholeAnswer(t *testing.T, got []byte, err error, status int, prefix string) {
	t.Helper()
	if err != nil {
		t.Errorf("read after the answer: %v (reset: %v); want the answer then a clean close", err, errors.Is(err, syscall.ECONNRESET))
	}
	resp, perr := http.ReadResponse(bufio.NewReader(strings.NewReader(string(got))), nil)
	if perr != nil {
		t.Fatalf("no whole response in %q: %v", got, perr)
	}
	b, berr := io.ReadAll(resp.Body)
	if berr != nil || resp.StatusCode != status || !strings.HasPrefix(string(b), prefix) {
		t.Errorf("got %d %q (%v), want %d %s...", resp.StatusCode, b, berr, status, prefix)
	}
}

// TestRejectionMidUploadLingers: every answer given while the client is still sending its body
// reaches the client whole, followed by a clean close: the refused dial's 502, the exhausted
// pool's 502 (max_upstream_conns: 1), the 502 of an upstream that resets mid-upload, and the 500
// of a panic in either recover path. Without the lingering close the kernel answers the unread
// body with a reset, which here arrives after the answer (the client sees ECONNRESET) and on a
// real network can destroy the answer itself.
func TestRejectionMidUploadLingers(t *testing.T) {
	hold := make(chan struct{})
	busy := startUpstream(t, func(w http.ResponseWriter, r *http.Request) { <-hold })
	defer close(hold)
	resetter := startResettingUpstream(t)
	gw := startGateway(t, "",
		upstreamRoute("/refused", refusedAddr(t), "max_body_bytes: 2097152")+
			upstreamRoute("/pool", busy.addr, "max_body_bytes: 2097152\nmax_upstream_conns: 1\nconnect_timeout: 1s")+
			upstreamRoute("/reset", resetter, "max_body_bytes: 2097152")+
			upstreamRoute("/panic", busy.addr, "name: panic\nmax_body_bytes: 2097152\nmax_concurrency: 1"))

	t.Run("refused dial", func(t *testing.T) {
		got, err := uploadAndReadAll(t, gw.addr, "/refused")
		checkWholeAnswer(t, got, err, 502, `{"error":"502 Bad Gateway: upstream connection refused"}`)
	})
	t.Run("reset mid-upload", func(t *testing.T) {
		got, err := uploadAndReadAll(t, gw.addr, "/reset")
		checkWholeAnswer(t, got, err, 502, `{"error":"502 Bad Gateway: `)
	})
	t.Run("exhausted pool", func(t *testing.T) {
		// One request holds the route's only upstream connection.
		held := make(chan error, 1)
		go func() {
			_, _, _, err := getStatus(gw.addr, "/pool/hold")
			held <- err
		}()
		busy.awaitInflight(1)
		got, err := uploadAndReadAll(t, gw.addr, "/pool")
		checkWholeAnswer(t, got, err, 502, `{"error":"502 Bad Gateway: upstream connect timeout"}`)
	})
	for _, at := range []string{faultHeaderHook, faultHandler} {
		t.Run("panic in "+at, func(t *testing.T) {
			armFault(t, at)
			got, err := uploadAndReadAll(t, gw.addr, "/panic")
			checkWholeAnswer(t, got, err, 500, `{"error":"500 Internal Server Error: `)
			// Both recover paths release what admission took (SPEC 3 step 11).
			deadline := time.Now().Add(5 * time.Second)
			for gw.g.stats.get("panic").bulkhead.InFlight() != 0 || gw.g.workers.Busy() > busy.inflight.Load() {
				if time.Now().After(deadline) {
					t.Fatalf("after the panic: route in flight %d, workers busy %d", gw.g.stats.get("panic").bulkhead.InFlight(), gw.g.workers.Busy())
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}

// armFault makes the gateway panic at the fault point at until the test ends.
func armFault(t *testing.T, at string) {
	t.Helper()
	faultAt.Store(&at)
	t.Cleanup(func() { faultAt.Store(nil) })
}

// startResettingUpstream accepts connections, reads the first byte of each request and resets the
// connection (SO_LINGER 0): an upstream that dies mid-upload.
func startResettingUpstream(t *testing.T) string {
	t.Helper()
	return startScriptedUpstream(t, func(c net.Conn, _ *bufio.Reader) {
		// Reset as soon as the request begins: the gateway has most of the client's
		// 200 KiB still unread when its write fails.
		var buf [1]byte
		_, _ = c.Read(buf[:])
		_ = c.(*net.TCPConn).SetLinger(0)
	})
}
