package demo

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"toron/internal/testnet"
)

// demoTarget is one entry of a demo route's targets, as TestRoutesYAML decodes it.
type demoTarget struct {
	URL string `yaml:"url"`
}

func TestTwoAPIInstances(t *testing.T) {
	u := startUpstreams(t)
	c := &http.Client{Timeout: 10 * time.Second}
	for addr, want := range map[string]string{u.API: "api-1", u.API2: "api-2"} {
		status, _, body := do(t, c, newRequest(t, http.MethodGet, "http://"+addr+"/api/users", nil))
		var got apiReply
		decode(t, body, &got)
		if status != http.StatusOK || got.Instance != want || got.Service != "api" {
			t.Errorf("GET %s/api/users: %d %+v, want 200 from %s", addr, status, got, want)
		}
	}
	if u.API == u.API2 {
		t.Fatal("the two instances share an address")
	}
	if b := u.Banner("http://127.0.0.1:8080"); !strings.Contains(b, u.API2) || !strings.Contains(b, "-X POST http://127.0.0.1:8080/api/failover") ||
		!strings.Contains(b, "grep -oE 'api-[12]|[0-9]{3}$'") {
		t.Errorf("banner lacks the two-instance and failover lines:\n%s", b)
	}
}

func TestFailoverStopsAPI2(t *testing.T) {
	u := startUpstreams(t)
	// A keep-alive connection to api-2 that the stop must cut, as a crash would.
	held := keptAliveConn(t, u.API2)
	buf := make([]byte, 4096)

	c := &http.Client{Timeout: 10 * time.Second}
	if status, _, _ := do(t, c, newRequest(t, http.MethodGet, "http://"+u.API+failoverPath, nil)); status != http.StatusMethodNotAllowed {
		t.Errorf("GET %s: %d, want 405", failoverPath, status)
	}
	status, _, body := do(t, c, newRequest(t, http.MethodPost, "http://"+u.API+failoverPath, nil))
	var got failoverReply
	decode(t, body, &got)
	if status != http.StatusOK || got != (failoverReply{Stopped: "api-2", For: "30s", AnsweredBy: "api-1"}) {
		t.Fatalf("POST %s: %d %s", failoverPath, status, body)
	}
	if status, _, _ := do(t, c, newRequest(t, http.MethodPost, "http://"+u.API+failoverPath, nil)); status != http.StatusConflict {
		t.Errorf("a second stop: %d, want 409", status)
	}
	// api-2 refuses new connections, and the one it had is cut.
	if conn, err := net.DialTimeout("tcp", u.API2, 5*time.Second); err == nil {
		conn.Close()
		t.Fatal("a stopped instance accepted a connection")
	}
	_ = held.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := held.Read(buf); err == nil {
		t.Fatalf("the stopped instance's open connection still reads (%q)", buf[:n])
	}
	// api-1 is untouched.
	if status, _, _ := do(t, c, newRequest(t, http.MethodGet, "http://"+u.API+"/api/users", nil)); status != http.StatusOK {
		t.Errorf("api-1 answered %d during the failover", status)
	}
}

// TestFailoverAnsweredByAPI2: when api-2 itself receives the failover request, its answer
// arrives whole, marked Connection: close, and then that connection ends; another open
// connection of api-2 is cut.
func TestFailoverAnsweredByAPI2(t *testing.T) {
	u := startUpstreams(t)
	other := keptAliveConn(t, u.API2)
	self := testnet.Dial(t, u.API2)
	if _, err := self.Write([]byte("POST " + failoverPath + " HTTP/1.1\r\nHost: demo\r\nContent-Length: 0\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	_ = self.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(self)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("the failover's answer from api-2: %v", err)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("the failover's answer body: %v", err)
	}
	var got failoverReply
	decode(t, body, &got)
	if resp.StatusCode != http.StatusOK || !resp.Close || got != (failoverReply{Stopped: "api-2", For: "30s", AnsweredBy: "api-2"}) {
		t.Fatalf("POST %s to api-2: %d close=%v %s", failoverPath, resp.StatusCode, resp.Close, body)
	}
	if n, err := br.Read(make([]byte, 1)); err == nil {
		t.Fatalf("api-2's connection stays open after its failover answer (%d bytes more)", n)
	}
	_ = other.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := other.Read(make([]byte, 1)); err == nil {
		t.Fatalf("api-2's other connection still reads (%d bytes)", n)
	}
}

// keptAliveConn is a keep-alive connection to addr that has had one request answered.
func keptAliveConn(t *testing.T, addr string) net.Conn {
	t.Helper()
	c := testnet.Dial(t, addr)
	if _, err := c.Write([]byte("GET /api/x HTTP/1.1\r\nHost: demo\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatal(err)
	}
	return c
}

func TestPausedListenerResumes(t *testing.T) {
	l := testnet.Listen(t)
	pl := &pausableListener{current: l, addr: l.Addr(), resumed: closedChan()}
	done := make(chan struct{})
	accepted := make(chan net.Conn, 1)
	go func() {
		defer close(done)
		for {
			c, err := pl.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	if err := pl.pause(200*time.Millisecond, stop, &wg); err != nil {
		t.Fatal(err)
	}
	if c, err := net.Dial("tcp", pl.Addr().String()); err == nil {
		c.Close()
		t.Fatal("dial succeeded while paused")
	}
	var c net.Conn
	var err error
	deadline := time.Now().Add(10 * time.Second)
	for {
		if c, err = net.Dial("tcp", pl.Addr().String()); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("never listened again: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.Close()
	(<-accepted).Close()
	pl.Close()
	<-done
	wg.Wait()
	close(stop)
}
