package auth

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// authService is a forward-auth server on loopback whose answer the test picks per request.
type authService struct {
	*httptest.Server
	mu   sync.Mutex
	last http.Header
}

func newAuthService(t testing.TB, h func(w http.ResponseWriter, r *http.Request)) *authService {
	s := &authService{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.last = r.Header.Clone()
		s.mu.Unlock()
		h(w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *authService) seen() http.Header {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

// newForward is NewForward(o), which must succeed, closed when the test ends.
func newForward(t testing.TB, o ForwardOptions) *Forward {
	t.Helper()
	f, err := NewForward(o)
	return closedAtEnd(t, f, err)
}

func TestForwardAdmitsAndCopiesUpstreamHeaders(t *testing.T) {
	svc := newAuthService(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer good" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="sso"`)
			w.Header().Add("Set-Cookie", "a=1; Path=/")
			w.Header().Add("Set-Cookie", "b=2; Path=/")
			w.Header().Set("X-Internal", "not relayed")
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(401)
			w.Write([]byte("<a href=/login>login</a>"))
			return
		}
		w.Header().Set("X-User", "alice")
		w.Header().Set("X-Not-Listed", "x")
		w.WriteHeader(204)
	})
	f := newForward(t, ForwardOptions{URL: svc.URL + "/verify", RequestHeaders: []string{"Authorization", "Cookie"},
		UpstreamHeaders: []string{"X-User", "X-Groups"}})
	in := input("Authorization", "Bearer good", "Cookie", "s=1", "X-User", "forged", "X-Groups", "forged", "X-Other", "y")
	v := f.Check(in)
	if v.Outcome != Pass {
		t.Fatalf("2xx: %v", v)
	}
	got := svc.seen()
	want := map[string]string{"X-Forwarded-Method": "GET", "X-Forwarded-Proto": "https", "X-Forwarded-Host": "app.test",
		"X-Forwarded-Uri": "/app/page?x=1", "X-Forwarded-For": "192.0.2.7", "Authorization": "Bearer good", "Cookie": "s=1", "X-Other": ""}
	for k, w := range want {
		if got.Get(k) != w {
			t.Errorf("subrequest %s = %q, want %q", k, got.Get(k), w)
		}
	}
	f.Prepare(in.Header, &v)
	if string(in.Header.Peek("X-User")) != "alice" || in.Header.Peek("X-Groups") != nil {
		t.Errorf("upstream headers: X-User %q X-Groups %q", in.Header.Peek("X-User"), in.Header.Peek("X-Groups"))
	}

	v = f.Check(input("Authorization", "Bearer bad"))
	if v.Outcome != Denied || v.Status != 401 || v.Reason() != "auth_denied" || string(v.Body) != "<a href=/login>login</a>" {
		t.Fatalf("401 relayed: %+v", v)
	}
	relay := map[string][]string{}
	for _, h := range v.Relay {
		relay[h.Name] = append(relay[h.Name], h.Value)
	}
	if relay["WWW-Authenticate"][0] != `Bearer realm="sso"` || len(relay["Set-Cookie"]) != 2 || relay["Content-Type"][0] != "text/html" || relay["X-Internal"] != nil {
		t.Errorf("relayed headers: %v", relay)
	}
}

func TestForwardRelaysRedirectAndBoundsBody(t *testing.T) {
	svc := newAuthService(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("big") != "" {
			w.WriteHeader(403)
			w.Write([]byte(strings.Repeat("x", ForwardMaxBodyBytes+1)))
			return
		}
		w.Header().Set("Location", "https://sso.test/login?rd="+r.Header.Get("X-Forwarded-Uri"))
		w.WriteHeader(302)
	})
	f := newForward(t, ForwardOptions{URL: svc.URL})
	v := f.Check(input())
	if v.Outcome != Denied || v.Status != 302 || len(v.Relay) != 1 || v.Relay[0].Value != "https://sso.test/login?rd=/app/page?x=1" {
		t.Errorf("redirect: %+v", v)
	}
	big := newForward(t, ForwardOptions{URL: svc.URL + "/?big=1"})
	if v := big.Check(input()); v.Outcome != Unavailable {
		t.Errorf("an answer above %d bytes: %v", ForwardMaxBodyBytes, v)
	}
}

func TestForwardSlowIsUnavailableWithinTimeout(t *testing.T) {
	release := make(chan struct{})
	svc := newAuthService(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	defer close(release)
	f := newForward(t, ForwardOptions{URL: svc.URL, Timeout: 100 * time.Millisecond})
	start := time.Now()
	v := f.Check(input())
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("slow service held the request %s (timeout 100ms)", took)
	}
	if v.Outcome != Unavailable || v.Status != 503 || v.Reason() != "auth_unavailable" ||
		string(v.Body) != `{"error":"503 Service Unavailable: Authentication service unavailable"}` {
		t.Errorf("slow service: %+v", v)
	}
}

func TestForwardDownIsUnavailable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now: the dial is refused
	f := newForward(t, ForwardOptions{URL: "http://" + addr + "/auth", Timeout: time.Second})
	if v := f.Check(input()); v.Outcome != Unavailable {
		t.Errorf("service down: %v", v)
	}
}

func TestForwardAtMaxConcurrencyIsUnavailableAtOnce(t *testing.T) {
	entered := make(chan struct{}, 4)
	release := make(chan struct{})
	svc := newAuthService(t, func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-release
		w.WriteHeader(200)
	})
	f := newForward(t, ForwardOptions{URL: svc.URL, MaxConcurrency: 2, Timeout: 5 * time.Second})
	results := make(chan Verdict, 2)
	for range 2 {
		go func() { results <- f.Check(input()) }()
	}
	<-entered
	<-entered
	start := time.Now()
	v := f.Check(input())
	if took := time.Since(start); took > time.Second {
		t.Errorf("third call waited %s at max_concurrency", took)
	}
	if v.Outcome != Unavailable {
		t.Errorf("third call at max_concurrency 2: %v", v)
	}
	close(release)
	for range 2 {
		if v := <-results; v.Outcome != Pass {
			t.Errorf("calls in flight: %v", v)
		}
	}
	if v := f.Check(input()); v.Outcome != Pass {
		t.Errorf("after they finished: %v", v)
	}
}

func TestNewForwardRefusesOtherSchemes(t *testing.T) {
	for _, u := range []string{"ftp://x/", "x:80", "", "http://user:pw@x/", "//x/"} {
		if _, err := NewForward(ForwardOptions{URL: u}); err == nil {
			t.Errorf("%q accepted", u)
		}
	}
}
