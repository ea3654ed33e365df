package demo

import (
	"fmt"
	"strings"
)

// routesTemplate is the demo route table: the seed's three recipes and its fast /api route, in
// the seed's order. The %[n]s verbs are the upstream addresses: 1 api, 2 reports, 3 upload,
// 4 the second api instance.
const routesTemplate = `# Toron demo route table: the seed's recipes, pointed at the built-in demo upstreams.
# A key a route does not set inherits the server value (4 MiB bodies, 5s timeouts).
routes:
  # Recipe 1: 200 MB uploads, 16 at once, 10s sliding read window, streamed.
  - type: upstream
    prefix: /legacy/upload
    target: http://%[3]s
    max_body_bytes: 209715200
    max_concurrency: 16
    read_timeout: 10s
    stream_request_body: true
    # least_request, not p2c: an upload's time measures its size, not the sink's health, so a
    # latency estimate would call a sink that just took a 200 MB body slow. Requests in flight
    # are the right measure here (one target today; a second sink is balanced that way).
    balance: least_request

  # The fast API, protected by the server defaults, served by two instances: p2c balancing,
  # passive health and one retry on the other instance by default (SPEC 13).
  - type: upstream
    prefix: /api
    targets:
      - url: http://%[1]s
      - url: http://%[4]s

  # Recipe 2: reports that take up to 60s, 8 at once.
  - type: upstream
    prefix: /legacy/reports
    target: http://%[2]s
    max_concurrency: 8
    response_header_timeout: 60s
    write_timeout: 30s

  # Recipe 3: chunked uploads passed through chunked, up to 500 MB. max_concurrency is left to
  # the guardrail: min(32, worker_pool_size/4) = 32.
  - type: upstream
    prefix: /legacy/stream-upload
    target: http://%[3]s
    inbound_chunked_mode: passthrough
    max_body_bytes: 524288000
    read_timeout: 15s
    stream_request_body: true

  # A per-client rate limit (SPEC 17): 1 request per second per client IP, bursts of 3.
  - type: upstream
    prefix: /api/limited
    target: http://%[1]s
    rate_limit: {requests_per_second: 1, burst: 3}
`

// RoutesYAML returns a routes.yaml document with the seed's recipes pointed at these upstreams.
func (u *Upstreams) RoutesYAML() []byte {
	out := fmt.Appendf(fmt.Appendf(nil, routesTemplate, u.API, u.Reports, u.Upload, u.API2), wsRoutesTemplate, u.API, u.WS)
	out = fmt.Appendf(out, trafficRoutesTemplate, u.API)
	out = append(out, u.globalRoutesYAML()...)
	if u.Auth != nil {
		out = fmt.Appendf(out, authRoutesTemplate, u.API, u.Auth.UsersFile, u.Auth.JWKSFile)
	}
	return out
}

// bannerTemplate is the startup text. The %[n]s verbs: 1 gateway URL, 2 api, 3 reports,
// 4 upload, 5 api-2.
const bannerTemplate = `Toron demo
  gateway  %[1]s   (/health and /metrics are answered by the gateway itself)
  upstreams, built in, on loopback:
    api      %[2]s   fast JSON API: echoes method, path, X-Request-Id and body size ("instance":"api-1")
    api-2    %[5]s   a second instance of the same API ("instance":"api-2"); POST /api/failover stops it for 30 s
    reports  %[3]s   slow reports: ?delay=15s (default 2s, max 5m), ?size=BYTES streams padding (max 1 GiB)
    upload   %[4]s   upload sink: counts and hashes the body, tells how it was framed

Routes (unset keys inherit the server defaults: 4 MiB bodies, 5s read/write, 10s for upstream headers):
  /api                   -> api, api-2  defaults; a declared body over 4 MiB is a 413 from the headers alone;
                                     two targets: p2c, passive health, 1 retry on the other target
  /legacy/upload         -> upload   recipe 1: 200 MiB bodies, 16 at once, 10s sliding read window, streamed,
                                     balance: least_request (an upload's time is its size, not latency)
  /legacy/reports        -> reports  recipe 2: 8 at once, 60s for upstream headers (then 504), 30s write window
  /legacy/stream-upload  -> upload   recipe 3: 500 MiB bodies, chunked passed through chunked, 15s read window,
                                     32 at once (guardrail)
  /api/limited           -> api      rate_limit: 1 request/s per client IP, bursts of 3, then 429 with Retry-After
  The three legacy routes are elevated: together they hold at most 32 of the 128 workers, so /api
  and /health keep the rest.

Try:
  # a fast API call; the request id is forwarded and echoed back
  curl -s -H 'X-Request-Id: demo-1' %[1]s/api/users

  # /api is served by two instances: count who answered 20 requests (p2c spreads even one client)
  for i in $(seq 1 20); do curl -s -w ' %%{http_code}\n' %[1]s/api/users | grep -oE 'api-[12]|[0-9]{3}$' | paste -sd' '; done | sort | uniq -c

  # failover: stop api-2 for 30 s, then the same loop: still 20x 200, all from api-1 (a refused
  # dial is retried on the other target, and api-2 is ejected after 5 failures in a row)
  curl -s -X POST %[1]s/api/failover; echo
  for i in $(seq 1 20); do curl -s -w ' %%{http_code}\n' %[1]s/api/users | grep -oE 'api-[12]|[0-9]{3}$' | paste -sd' '; done | sort | uniq -c

  # health and metrics
  curl -s %[1]s/health
  curl -s %[1]s/metrics | grep toron_

  # 413 before any body byte: 5 MiB declared against /api's 4 MiB (curl sends Expect: 100-continue)
  head -c 5242880 /dev/zero | curl -s -w ' %%{http_code}\n' -X POST --data-binary @- %[1]s/api/upload

  # a 200 MB upload with a Content-Length, streamed to the sink; compare the two sha256 sums
  head -c 200000000 /dev/urandom > /tmp/toron-demo-200MB.bin && sha256sum /tmp/toron-demo-200MB.bin
  curl -s -X POST -T /tmp/toron-demo-200MB.bin -H 'Content-Type: application/octet-stream' %[1]s/legacy/upload
  #   add --limit-rate 2M: a 100 s upload completes, the read deadline slides while bytes flow

  # a chunked upload, passed through: the sink reports "transfer_encoding":"chunked","content_length":-1
  head -c 50000000 /dev/urandom | curl -s -X POST -T - -H 'Transfer-Encoding: chunked' %[1]s/legacy/stream-upload
  #   the same on /legacy/upload (normalize): a body of at most 64 KiB reaches the sink with a Content-Length
  printf 'hello' | curl -s -X POST -T - -H 'Transfer-Encoding: chunked' %[1]s/legacy/upload

  # a 15 s report (the route waits up to 60 s; delay=65s gets the gateway's 504)
  curl -s '%[1]s/legacy/reports?delay=15s'

  # a 1 GiB download streamed in constant memory
  curl -s -o /dev/null -w '%%{size_download} bytes in %%{time_total}s\n' '%[1]s/legacy/reports?delay=0s&size=1073741824'

  # bulkhead: 12 reports at once on a route of 8 give 8x 200 and 4x 503 (Retry-After: 5)
  (for i in $(seq 1 12); do curl -s -o /dev/null -w '%%{http_code}\n' '%[1]s/legacy/reports?delay=10s' & done; wait) | sort | uniq -c
  #   meanwhile, in another terminal, /api stays fast
  curl -s -o /dev/null -w '%%{http_code} in %%{time_total}s\n' %[1]s/api/users

  # rate limit: 5 quick calls give 200 200 200 429 429 (a token a second, bursts of 3)
  for i in 1 2 3 4 5; do curl -s -o /dev/null -w '%%{http_code} ' %[1]s/api/limited/x; done; echo

Not built (SPEC 11): HTTP/2.
`

// Banner returns the text printed at startup: what runs where and curl commands to try, given the
// gateway's base URL (e.g. "http://127.0.0.1:8080").
func (u *Upstreams) Banner(gatewayURL string) string {
	base := strings.TrimRight(gatewayURL, "/")
	out := fmt.Sprintf(bannerTemplate, base, u.API, u.Reports, u.Upload, u.API2) + fmt.Sprintf(wsBannerTemplate, base) + fmt.Sprintf(trafficBannerTemplate, base) + u.redisBanner(base)
	if u.Auth != nil {
		out += fmt.Sprintf(authBannerTemplate, base, AuthDemoUser, AuthDemoPassword, u.Auth.Token)
	}
	return out
}
