// This file owns the gateway's side of the upstream exchange: what a request hands
// up.Set.Forward (its client IP, its streamed body, its client watch), what it keeps of the
// answer, and each failed attempt's outcome for passive health, judged with what only the
// request knows (its client's body, the client watch).
package gateway

import (
	"errors"
	"io"
	"time"

	"github.com/valyala/fasthttp"

	up "toron/upstream"
)

// forward sends the request to one of the route's targets (up.Set.Forward: the balancer, a
// slot of the target's pool, the exchange, the retries) and keeps what answered on the
// exchange, which gives the connection back and the target its outcome (exchange.finish).
func (g *Gateway) forward(x *exchange, req *fasthttp.Request, resp *fasthttp.Response) (time.Time, error) {
	r := x.route
	// client_ip_hash hashes the client IP of SPEC 16, the one every consumer sees.
	ip := x.clientIPOf().As16()
	x.out.Body, x.out.Watch = nil, x.watch
	if req.IsBodyStream() {
		x.out.Body = &x.body
	}
	// The attempt's result is written into the exchange: the attempt loop is the deepest
	// call of a request, and every word kept off its frames keeps the connection's
	// goroutine within a 4 KiB stack (SPEC 22: a waiting goroutine keeps the stack it grew to).
	a := &x.att
	err := r.set.Forward(ip[:], r.eff.ConnectTimeout, &x.out, req, resp, x, a)
	x.upAddr = a.Addr
	if err != nil {
		return time.Time{}, err
	}
	x.upTarget, x.upPool, x.upSlot, x.upConn = a.Target, a.Pool, true, a.Conn
	x.upReusable, x.upStatus = up.KeepAlive(resp), resp.StatusCode()
	return a.SentAt, nil
}

// AttemptOutcome classifies a failed attempt for passive health (SPEC 13, up.Judge): the
// target failed (a refused or timed-out dial, a failed handshake, a reset or close before the
// response headers, the header timeout), or nobody did (the client left, its body failed).
func (x *exchange) AttemptOutcome(err error) (up.Outcome, int) {
	switch {
	case x.body.err != nil && !errors.Is(x.body.err, io.EOF),
		errors.Is(err, up.ErrClientLeft),
		x.watch != nil && x.watch.Gone():
		return up.Neutral, statusClientClosed
	}
	return up.Failure, upstreamRejection(err).status
}

var _ up.Judge = (*exchange)(nil)
