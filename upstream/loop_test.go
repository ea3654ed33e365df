package upstream

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"toron/internal/testnet"

	"github.com/VictoriaMetrics/metrics"
)

// oneExchange sends a GET over a new connection dialed with r and returns the status; err
// is the dial's (nothing was written) or the exchange's.
func oneExchange(r *Resolver, addr string) (status int, dialErr, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := r.Dial(ctx, addr)
	if err != nil {
		return 0, err, nil
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")); err != nil {
		return 0, nil, err
	}
	line, err := bufio.NewReader(c).ReadSlice('\n')
	if err != nil {
		return 0, nil, err
	}
	code, ok := statusCode(line)
	if !ok {
		return 0, nil, net.UnknownNetworkError("bad status line")
	}
	return code, nil, nil
}

// TestRefusedTargetBehindRetries runs the package doc's request loop over real sockets: of
// three targets one refuses every dial. Every request answers 200 (its refused attempt is
// retried on another target), and after consecutive_failures refusals the target is ejected,
// so it costs 5 extra dials in all, not one per request.
// pickAttempts runs one request's attempts the way the gateway does: it picks a target not yet
// tried (for the client IP ip), hands it to attempt with the attempt's number (1 first), and
// picks again while attempt asks for another and a target is left.
func pickAttempts(s *Set, ip []byte, attempt func(tg *Target, n int) (again bool)) {
	var tried [MaxRetries + 1]*Target
	for n := 0; n < len(tried); {
		tg := s.Pick(ip, tried[:n]...)
		if tg == nil {
			return
		}
		tried[n] = tg
		n++
		if !attempt(tg, n) {
			return
		}
	}
}

func TestRefusedTargetBehindRetries(t *testing.T) {
	ok := func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(200) }
	a, b := httptest.NewServer(http.HandlerFunc(ok)), httptest.NewServer(http.HandlerFunc(ok))
	defer a.Close()
	defer b.Close()
	deadAddr := testnet.RefusedAddr(t)

	ms := metrics.NewSet()
	var events []Event
	s, err := NewSet(Config{
		Route:   "api",
		Targets: []TargetConfig{{Addr: a.Listener.Addr().String()}, {Addr: deadAddr}, {Addr: b.Listener.Addr().String()}},
		Passive: PassiveConfig{ConsecutiveFailures: 5, EjectTime: 30 * time.Second, MaxEjectTime: 300 * time.Second, MaxEjectedPercent: 50},
		Retries: 1,
		Metrics: ms,
		OnEvent: func(e Event) { events = append(events, e) },
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var r Resolver
	refused := 0
	for i := range 60 {
		status := 0
		pickAttempts(s, nil, func(tg *Target, n int) bool {
			code, dialErr, err := oneExchange(&r, tg.Addr())
			switch {
			case dialErr != nil:
				refused++
				tg.Done(Failure, 502)
				if n <= s.Retries() {
					s.CountRetry()
					return true
				}
				status = 502
			case err != nil:
				tg.Done(Failure, 502)
				status = 502
			default:
				tg.Done(OutcomeOf(code), code)
				status = code
			}
			return false
		})
		if status != 200 {
			t.Fatalf("request %d answered %d", i, status)
		}
	}
	if refused != 5 {
		t.Errorf("%d refused dials for 60 requests, want 5 (then the target is ejected)", refused)
	}
	text := scrape(ms)
	for _, want := range []string{
		`toron_upstream_retries_total{route="api"} 5`,
		`toron_upstream_ejections_total{route="api",target="` + deadAddr + `"} 1`,
		`toron_upstream_requests_total{route="api",target="` + deadAddr + `",code="502"} 5`,
		`toron_upstream_healthy{route="api",target="` + deadAddr + `"} 0`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %s:\n%s", want, text)
		}
	}
	if len(events) != 1 || events[0].Kind != EventEjected || events[0].Target != deadAddr {
		t.Errorf("events %+v, want one ejection of %s", events, deadAddr)
	}
}
