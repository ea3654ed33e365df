package upstream

import (
	"errors"
	"testing"

	"github.com/valyala/fasthttp"
)

// A target that left its route after the balancer picked it (a DNS refresh or a reload
// retired it and closed its pool) is an attempt that sent nothing: Forward tries the route's
// other targets and reports ErrTargetGone, which SentNothing counts as retryable. It used to
// panic ("target without a connection pool"), seen once under load in the discovery test.
func TestForwardTargetGoneAfterPick(t *testing.T) {
	s := newTestSet(t, P2C, 1, 1)
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://a/x")
	var a Attempt
	err := s.Forward(nil, 0, &Outbound{}, req, resp, nil, &a)
	if !errors.Is(err, ErrTargetGone) || !SentNothing(err) {
		t.Fatalf("Forward on targets without pools: %v, want ErrTargetGone (retryable)", err)
	}
	if a.Conn != nil || a.Target != nil {
		t.Fatalf("an attempt on a gone target returned a connection: %+v", a)
	}
	for _, tg := range s.Targets() {
		if n := tg.InFlight(); n != 0 {
			t.Fatalf("%s: %d in flight after the gone attempts", tg.Addr(), n)
		}
	}
}
