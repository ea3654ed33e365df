package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"toron/internal/testnet"
)

// rssBytes is testnet.RSSBytes for a test: it skips where /proc cannot tell.
func rssBytes(t *testing.T, pid int) int64 {
	t.Helper()
	n, err := testnet.RSSBytes(pid)
	if err != nil {
		t.Skipf("no resident set from /proc: %v", err)
	}
	return n
}

// TestCompressMemoryBound: SPEC 20's memory bound. 1,000 compressed downloads are held in
// flight at once (each upstream sent its first 32 KiB of JSON and pauses until released, each
// client has read its first compressed bytes), and the RSS of the Toron process, sampled then,
// grew by at most 384 KiB per stream over its idle value, connections included. It runs the
// real binary (built without the race detector, whose shadow memory would be measured too).
func TestCompressMemoryBound(t *testing.T) {
	const streams = 1000
	const boundPerStream = 384 << 10
	piece := bytes.Repeat([]byte(`{"id":12345,"name":"a catalog item","category":"kitchen","price":"19.99","in_stock":true},`), 400)[:32<<10]
	var mu sync.Mutex
	release := make(chan struct{})
	released := func() chan struct{} { mu.Lock(); defer mu.Unlock(); return release }
	upAddr := startTestUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(piece)
		if r.URL.Path == "/warm" {
			return
		}
		w.(http.Flusher).Flush()
		<-released()
		_, _ = w.Write(piece)
	})
	for _, enc := range []string{"br", "zstd", "gzip"} {
		t.Run(enc, func(t *testing.T) {
			cmd, _, base := startGateway(t, "  worker_pool_size: 1100\n  worker_queue_timeout: 10s\n  connect_timeout: 30s\n  response_header_timeout: 60s\n  drain_delay: 0s\n", "  access: false\n",
				fmt.Sprintf("routes:\n  - {type: upstream, prefix: /, target: \"http://%s\", max_upstream_conns: 1100, compress: true}\n", upAddr))
			addr := strings.TrimPrefix(base, "http://")

			// Warm up (pools, first encoders), then the idle value.
			for range 3 {
				c := testnet.Dial(t, addr)
				fmt.Fprintf(c, "GET /warm HTTP/1.1\r\nHost: a\r\nAccept-Encoding: %s\r\n\r\n", enc)
				br := bufio.NewReader(c)
				if _, err := http.ReadResponse(br, nil); err != nil {
					t.Fatal(err)
				}
				c.Close()
			}
			time.Sleep(200 * time.Millisecond)
			idle := rssBytes(t, cmd.Process.Pid)

			mu.Lock()
			release = make(chan struct{})
			mu.Unlock()
			errs := make(chan error, streams)
			var ready sync.WaitGroup
			for range streams {
				c := testnet.Dial(t, addr) // closed when the subtest ends, after the peak is read
				ready.Add(1)
				go func() {
					defer ready.Done()
					_ = c.SetDeadline(time.Now().Add(60 * time.Second))
					if _, err := fmt.Fprintf(c, "GET /s HTTP/1.1\r\nHost: a\r\nAccept-Encoding: %s\r\nConnection: close\r\n\r\n", enc); err != nil {
						errs <- err
						return
					}
					br := bufio.NewReader(c)
					resp, err := http.ReadResponse(br, nil)
					if err != nil {
						errs <- err
						return
					}
					if ce := resp.Header.Get("Content-Encoding"); ce != enc {
						b, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
						errs <- fmt.Errorf("status %d, Content-Encoding %q: %s", resp.StatusCode, ce, b)
						return
					}
					var one [1]byte
					if _, err := io.ReadFull(resp.Body, one[:]); err != nil { // the first compressed bytes
						errs <- err
					}
				}()
			}
			ready.Wait()
			close(errs)
			for err := range errs {
				t.Fatalf("a download failed: %v", err)
			}
			peak := rssBytes(t, cmd.Process.Pid)
			close(released())
			perStream := (peak - idle) / streams
			t.Logf("%s: RSS idle %d MiB, %d streams in flight %d MiB: %d KiB per stream (bound %d KiB)", enc, idle>>20, streams, peak>>20, perStream>>10, boundPerStream>>10)
			if perStream > boundPerStream {
				t.Errorf("%d KiB of RSS per compressing stream, above SPEC 20's %d KiB", perStream>>10, boundPerStream>>10)
			}
		})
	}
}
