// k6 equivalent of `loadtest -scenario small-get`: GET /api throughput through a running Toron.
//
//   k6 run -e BASE=http://127.0.0.1:8080 -e DURATION=10s -e VUS=64 loadtest/k6/small-get.js
//   k6 run -e RATE=5000 loadtest/k6/small-get.js    # a constant rate instead of as fast as VUs allow
//
// Start the gateway first (make run, or bin/toron -config ... -routes ...). BASE must be a
// loopback address.
import http from 'k6/http';
import { check } from 'k6';

const BASE = __ENV.BASE || 'http://127.0.0.1:8080';
const DURATION = __ENV.DURATION || '10s';
const VUS = parseInt(__ENV.VUS || '64', 10);
const RATE = parseInt(__ENV.RATE || '0', 10);

export const options = {
  discardResponseBodies: true,
  summaryTrendStats: ['avg', 'med', 'p(90)', 'p(99)', 'max'],
  scenarios: {
    small_get: RATE > 0
      ? { executor: 'constant-arrival-rate', rate: RATE, timeUnit: '1s', duration: DURATION, preAllocatedVUs: VUS, maxVUs: VUS * 4 }
      : { executor: 'constant-vus', vus: VUS, duration: DURATION },
  },
  thresholds: {
    http_req_failed: ['rate==0'],
  },
};

export default function () {
  const res = http.get(`${BASE}/api/items`, { tags: { series: 'api' } });
  check(res, { 'status is 200': (r) => r.status === 200 });
}
