// k6 equivalent of `loadtest -scenario slow-client`. k6 has no raw sockets: it cannot drip
// headers or a body, nor read a response slowly. The attackers therefore come from slowhttptest
// (scripts/install-bench-deps.sh installs it), one instance per attack kind, and this script is
// the measuring half: /api and /health at a constant rate, which must keep answering 200.
//
// With the gateway on 127.0.0.1:8080 (make run):
//   slowhttptest -H -c 300 -r 100 -i 1 -l 30 -u http://127.0.0.1:8080/api/x &              # slow headers
//   slowhttptest -B -c 300 -r 100 -i 1 -s 1000000 -l 30 -u http://127.0.0.1:8080/api/x &  # trickled bodies
//   slowhttptest -X -c 100 -r 100 -w 1 -y 64 -n 1 -z 64 -l 30 \
//       -u 'http://127.0.0.1:8080/legacy/reports?delay=0s&size=16777216' &                  # slow reads
//   k6 run -e BASE=http://127.0.0.1:8080 -e DURATION=25s loadtest/k6/slow-client.js
//
// The Go scenario runs the three attacks itself and also reports how fast each attacker was cut.
import http from 'k6/http';
import { check } from 'k6';

const BASE = __ENV.BASE || 'http://127.0.0.1:8080';
const DURATION = __ENV.DURATION || '10s';
const API_RATE = parseInt(__ENV.API_RATE || '200', 10);
const HEALTH_RATE = parseInt(__ENV.HEALTH_RATE || '20', 10);

export const options = {
  discardResponseBodies: true,
  summaryTrendStats: ['avg', 'med', 'p(90)', 'p(99)', 'max'],
  scenarios: {
    api: {
      executor: 'constant-arrival-rate', exec: 'api', rate: API_RATE, timeUnit: '1s',
      duration: DURATION, preAllocatedVUs: 10, maxVUs: 200, tags: { series: 'api' },
    },
    health: {
      executor: 'constant-arrival-rate', exec: 'health', rate: HEALTH_RATE, timeUnit: '1s',
      duration: DURATION, preAllocatedVUs: 5, maxVUs: 50, tags: { series: 'health' },
    },
  },
  thresholds: {
    'http_req_failed{series:api}': ['rate==0'],
    'http_req_failed{series:health}': ['rate==0'],
    'http_req_duration{series:api}': ['p(99)<1000'],
    'http_req_duration{series:health}': ['p(99)<1000'],
  },
};

export function api() {
  const res = http.get(`${BASE}/api/items`, { timeout: '5s' });
  check(res, { 'api 200': (r) => r.status === 200 });
}

export function health() {
  const res = http.get(`${BASE}/health`, { timeout: '1s' });
  check(res, { 'health 200': (r) => r.status === 200 });
}
