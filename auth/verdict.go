// Package auth decides who may pass a route, from the request headers alone (SPEC 19): IP access
// lists, HTTP Basic against an htpasswd file of bcrypt hashes, JWT bearer tokens checked against
// a JWKS, and forward auth's subrequest to an external service. Each check returns a Verdict that
// the gateway maps to its 403, 401 or 503 answer (or relays, for forward auth); auth itself never
// writes a response.
//
// None of the checks holds a gateway worker or a route slot: the gateway runs them in its header
// hook, on the connection's own goroutine, before it takes a slot or a worker (SPEC 3 step 6).
// Every wait a check may do is bounded: a bcrypt slot (BasicHashWait), a JWKS refresh on an
// unknown kid (JWTUnknownKidWait), a forward-auth call (its timeout).
package auth

import "strconv"

// Outcome is what a check decided.
type Outcome uint8

// The outcomes of a check.
const (
	// Pass admits the request; Verdict.Upstream may hold headers to set on the upstream request.
	Pass Outcome = iota
	// Forbidden refuses a client address outside the route's access lists: 403.
	Forbidden
	// Unauthorized refuses a missing or invalid Basic credential or JWT: 401 with a challenge.
	Unauthorized
	// Denied relays a forward-auth service's own non-2xx answer to the client.
	Denied
	// Unavailable is a forward-auth service that did not answer within its timeout, or was at
	// its max_concurrency: 503.
	Unavailable
	// Busy is a bcrypt check that found every hash slot taken for BasicHashWait: 503 with
	// Retry-After: 1.
	Busy
)

// Reasons of toron_rejected_total (SPEC 8), one per refusing outcome.
const (
	ReasonForbidden    = "forbidden"
	ReasonUnauthorized = "unauthorized"
	ReasonDenied       = "auth_denied"
	ReasonUnavailable  = "auth_unavailable"
	ReasonBusy         = "auth_busy"
)

// The exact JSON bodies of the gateway's own refusals (SPEC 19, SPEC 3).
var (
	BodyForbidden     = []byte(`{"error":"403 Forbidden: Client address not allowed"}`)
	BodyBusy          = []byte(`{"error":"503 Service Unavailable: Authentication busy"}`)
	BodyUnavailable   = []byte(`{"error":"503 Service Unavailable: Authentication service unavailable"}`)
	bodyCredRequired  = []byte(`{"error":"401 Unauthorized: Credentials required"}`)
	bodyCredInvalid   = []byte(`{"error":"401 Unauthorized: Invalid credentials"}`)
	bodyTokenRequired = []byte(`{"error":"401 Unauthorized: Bearer token required"}`)
	bodyTokenInvalid  = []byte(`{"error":"401 Unauthorized: Invalid token"}`)
)

// Bearer challenges (RFC 6750 3): a request without a token gets no error code, an invalid
// token gets invalid_token.
const (
	challengeBearer        = `Bearer`
	challengeBearerInvalid = `Bearer error="invalid_token"`
)

// Header is one header name and value.
type Header struct {
	Name, Value string
}

// Field is one header a passing verdict sets upstream, its name in fasthttp's canonical form
// (X-User); a cached verdict's fields are built once, with the verification.
type Field struct {
	Name, Value []byte
}

// Verdict is the decision of one check. The zero Verdict passes with nothing to add.
type Verdict struct {
	// Outcome is what was decided.
	Outcome Outcome
	// Challenge is the WWW-Authenticate value of an Unauthorized verdict.
	Challenge string
	// Upstream holds the headers a passing verdict sets on the upstream request (claims_to_headers,
	// forward auth's upstream_headers). It may be shared with a cache: never modify it.
	Upstream []Field
	// Status, Relay and Body are a Denied verdict's answer: the auth service's status, its
	// WWW-Authenticate, Location, Set-Cookie and Content-Type headers, and at most
	// ForwardMaxBodyBytes of its body. For the other refusals Body is the gateway's JSON.
	Status int
	Relay  []Header
	Body   []byte
}

// Predefined verdicts of the refusals whose answer never varies.
var (
	// VerdictForbidden is the access lists' refusal.
	VerdictForbidden = Verdict{Outcome: Forbidden, Status: 403, Body: BodyForbidden}
	// VerdictBusy is the refusal of a bcrypt check that found no hash slot in time.
	VerdictBusy = Verdict{Outcome: Busy, Status: 503, Body: BodyBusy}
	// VerdictUnavailable is the refusal of a forward-auth call that could not be made in time.
	VerdictUnavailable = Verdict{Outcome: Unavailable, Status: 503, Body: BodyUnavailable}
)

// Reason is the toron_rejected_total reason of a refusing verdict, "" for Pass.
func (v *Verdict) Reason() string {
	switch v.Outcome {
	case Forbidden:
		return ReasonForbidden
	case Unauthorized:
		return ReasonUnauthorized
	case Denied:
		return ReasonDenied
	case Unavailable:
		return ReasonUnavailable
	case Busy:
		return ReasonBusy
	}
	return ""
}

// RetryAfter is the Retry-After value of the verdict's answer, "" for none: a busy bcrypt
// check is worth retrying in a second (SPEC 19).
func (v *Verdict) RetryAfter() string {
	if v.Outcome == Busy {
		return "1"
	}
	return ""
}

// String names the outcome and status, for logs and test failures.
func (v Verdict) String() string {
	if v.Outcome == Pass {
		return "pass"
	}
	return v.Reason() + " " + strconv.Itoa(v.Status)
}

// unauthorized builds a 401 verdict.
func unauthorized(challenge string, body []byte) Verdict {
	return Verdict{Outcome: Unauthorized, Status: 401, Challenge: challenge, Body: body}
}
