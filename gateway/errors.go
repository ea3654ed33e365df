package gateway

import (
	"errors"
	"io"
	"net"
	"syscall"

	"github.com/valyala/fasthttp"

	"toron/limits"
	"toron/socket"
	"toron/timeouts"
	up "toron/upstream"
)

// rejection is a status the gateway answers itself, with its JSON body (SPEC 3: one key,
// "error", starting with the status code and reason phrase; never echoing request bytes).
type rejection struct {
	status     int
	reason     reason
	body       []byte
	retryAfter bool // Retry-After: 5 (the 503s of admission)
	traffic    bool // the answer of a traffic rule, written by writeTraffic (traffic.go)
}

func newRejection(status int, r reason, text string, retryAfter bool) *rejection {
	return &rejection{status: status, reason: r, body: []byte(`{"error":"` + text + `"}`), retryAfter: retryAfter}
}

// The exact texts of SPEC 3, and the other errors in the same shape.
var (
	rejBodyTooLarge = newRejection(fasthttp.StatusRequestEntityTooLarge, reasonBodyTooLarge,
		"413 Payload Too Large: request Content-Length exceeds effective route limit", false)
	rejBodyTooLargeStream = newRejection(fasthttp.StatusRequestEntityTooLarge, reasonBodyTooLarge,
		"413 Payload Too Large: request body exceeds effective route limit", false)
	rejConcurrency = newRejection(fasthttp.StatusServiceUnavailable, reasonConcurrency,
		"503 Service Unavailable: Route concurrency limit reached", true)
	rejElevatedBudget = newRejection(fasthttp.StatusServiceUnavailable, reasonElevatedBudget,
		"503 Service Unavailable: Route concurrency limit reached", true)
	rejWorkers = newRejection(fasthttp.StatusServiceUnavailable, reasonWorkersSaturated,
		"503 Service Unavailable: Worker pool saturated", true)
	rejUpstreamTimeout = newRejection(fasthttp.StatusGatewayTimeout, reasonUpstreamTimeout,
		"504 Gateway Timeout: Upstream response header timeout expired", false)
	rejNoRoute = newRejection(fasthttp.StatusNotFound, reasonNoRoute,
		"404 Not Found: no route matches the request", false)
	rejHeaderTooLarge = newRejection(fasthttp.StatusRequestHeaderFieldsTooLarge, reasonHeaderTooLarge,
		"431 Request Header Fields Too Large: request line and headers exceed max_header_bytes", false)
	rejBadRequest = newRejection(fasthttp.StatusBadRequest, reasonBadRequest,
		"400 Bad Request: malformed request", false)
	rejBadChunk = newRejection(fasthttp.StatusBadRequest, reasonBadRequest,
		"400 Bad Request: malformed chunked body", false)
	rejUpgrade = newRejection(fasthttp.StatusNotImplemented, reasonBadRequest,
		"501 Not Implemented: connection upgrades are not supported", false)
	rejReadTimeout = newRejection(fasthttp.StatusRequestTimeout, reasonReadTimeout,
		"408 Request Timeout: the request did not arrive in time", false)
	rejSlowClient = newRejection(fasthttp.StatusRequestTimeout, reasonSlowClient,
		"408 Request Timeout: the request body arrived too slowly", false)
	rejUpstreamRefused = newRejection(fasthttp.StatusBadGateway, reasonUpstreamError,
		"502 Bad Gateway: upstream connection refused", false)
	rejUpstreamDialTimeout = newRejection(fasthttp.StatusBadGateway, reasonUpstreamError,
		"502 Bad Gateway: upstream connect timeout", false)
	rejUpstreamReset = newRejection(fasthttp.StatusBadGateway, reasonUpstreamError,
		"502 Bad Gateway: upstream closed the connection before its response headers", false)
	rejUpstreamWriteTimeout = newRejection(fasthttp.StatusBadGateway, reasonUpstreamError,
		"502 Bad Gateway: upstream stopped reading the request", false)
	rejUpstreamTLS = newRejection(fasthttp.StatusBadGateway, reasonUpstreamError,
		"502 Bad Gateway: upstream TLS handshake failed", false)
	rejUpstreamBad = newRejection(fasthttp.StatusBadGateway, reasonUpstreamError,
		"502 Bad Gateway: upstream response could not be read", false)
	// rejNoTarget: the route has no target at the moment (DNS discovery found no address).
	rejNoTarget = newRejection(fasthttp.StatusServiceUnavailable, reasonNoTarget,
		"503 Service Unavailable: No upstream target", false)
	rejExpectation = newRejection(fasthttp.StatusExpectationFailed, reasonBadRequest,
		"417 Expectation Failed: only Expect: 100-continue is supported", false)
	rejInternal = newRejection(fasthttp.StatusInternalServerError, reasonNone,
		"500 Internal Server Error: the gateway failed to handle the request", false)
)

// admissionRejection maps an admission error of package limits to its answer.
func admissionRejection(err error) *rejection {
	// admit returns the sentinels themselves: compared first, without errors.Is's walk.
	switch err {
	case limits.ErrConcurrency:
		return rejConcurrency
	case limits.ErrElevatedBudget:
		return rejElevatedBudget
	case limits.ErrWorkersSaturated:
		return rejWorkers
	}
	switch {
	case errors.Is(err, limits.ErrBodyTooLarge):
		return rejBodyTooLarge
	case errors.Is(err, limits.ErrConcurrency):
		return rejConcurrency
	case errors.Is(err, limits.ErrElevatedBudget):
		return rejElevatedBudget
	case errors.Is(err, limits.ErrWorkersSaturated):
		return rejWorkers
	}
	panic("BUG: gateway: unknown admission error: " + err.Error())
}

// upstreamRejection maps an error of the upstream exchange (before response headers) to its
// answer: 504 for the header timeout, 502 for everything else (SPEC 3 step 9).
func upstreamRejection(err error) *rejection {
	var dialErr *up.DialError
	switch {
	case errors.Is(err, up.ErrNoTarget):
		return rejNoTarget
	case errors.As(err, new(*up.TLSHandshakeError)):
		return rejUpstreamTLS
	case errors.Is(err, up.ErrPoolExhausted):
		return rejUpstreamDialTimeout
	case errors.As(err, &dialErr):
		switch {
		case up.IsTLSHandshakeError(dialErr.Err):
			return rejUpstreamTLS
		case socket.IsTimeout(dialErr.Err):
			return rejUpstreamDialTimeout
		case errors.Is(dialErr.Err, syscall.ECONNREFUSED):
			return rejUpstreamRefused
		}
		// A connect can also end in a reset: the upstream accepted and reset the connection
		// before the dialer saw it complete (seen under load).
		return rejUpstreamReset
	case errors.Is(err, fasthttp.ErrConnectionClosed), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EPIPE), errors.Is(err, net.ErrClosed),
		// The connection ended inside the response headers.
		errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return rejUpstreamReset
	case errors.As(err, new(*up.WriteStallError)):
		return rejUpstreamWriteTimeout
	case errors.Is(err, fasthttp.ErrTimeout) || socket.IsTimeout(err):
		// The only read deadline on an upstream connection before the response is the header
		// timeout (up.Conn.Read); write stalls were told apart above.
		return rejUpstreamTimeout
	}
	return rejUpstreamBad
}

// clientErrorRejection maps an error fasthttp met while reading a request (before our hook
// decided, or in the body pre-read) to its answer. fasthttp's default handler answers these in
// plain text; SPEC 3 wants our JSON.
func clientErrorRejection(err error) *rejection {
	var small *fasthttp.ErrSmallBuffer
	switch {
	case errors.As(err, &small):
		return rejHeaderTooLarge
	case errors.Is(err, timeouts.ErrSlowClient):
		return rejSlowClient
	case socket.IsTimeout(err):
		return rejReadTimeout
	}
	return rejBadRequest
}

// isClientGone reports an error that means the client closed or reset its connection.
func isClientGone(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, net.ErrClosed) || errors.Is(err, errClientEOF)
}

// isEOF reports the end of the client's stream in the middle of a read.
func isEOF(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// errClientEOF marks a body that ended before its declared length: the client left mid-upload.
var errClientEOF = errors.New("gateway: client closed the connection mid-body")
