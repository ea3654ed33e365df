// k6 equivalent of `loadtest -scenario isolation`: every slot of the /legacy/reports bulkhead is
// held by a slow upstream call, a flood gets 503, and /api and /health must not notice.
//
//   k6 run -e BASE=http://127.0.0.1:8080 -e BULKHEAD=8 -e DURATION=10s loadtest/k6/isolation.js
//
// Against `make run` (demo mode: /legacy/reports?delay=... is a slow demo report, bulkhead 8).
// Compare the p(99) of http_req_duration{series:api_idle} and {series:api_saturated}: the target
// is a ratio of at most 1.5, with no /api or /health errors. The Go scenario does three
// interleaved rounds and reports medians; this script does one idle and one saturated phase.
import http from 'k6/http';
import { check } from 'k6';

const BASE = __ENV.BASE || 'http://127.0.0.1:8080';
const BULKHEAD = parseInt(__ENV.BULKHEAD || '8', 10);
const DURATION = __ENV.DURATION || '10s';
const SECONDS = parseInt(DURATION, 10);
const API_RATE = parseInt(__ENV.API_RATE || '200', 10);
const HEALTH_RATE = parseInt(__ENV.HEALTH_RATE || '20', 10);
const FLOOD_RATE = parseInt(__ENV.FLOOD_RATE || '200', 10);
const SATURATED_AT = `${SECONDS + 1}s`; // after the idle phase
const HOLD_DELAY = `${SECONDS + 3}s`; // the slow calls outlive the saturated phase

function rate(exec, perSecond, startTime, series) {
  return {
    executor: 'constant-arrival-rate', exec, rate: perSecond, timeUnit: '1s', duration: DURATION,
    preAllocatedVUs: 10, maxVUs: 200, startTime, tags: { series },
  };
}

export const options = {
  discardResponseBodies: true,
  summaryTrendStats: ['avg', 'med', 'p(90)', 'p(99)', 'max'],
  scenarios: {
    api_idle: rate('api', API_RATE, '0s', 'api_idle'),
    health_idle: rate('health', HEALTH_RATE, '0s', 'health_idle'),
    holders: {
      executor: 'per-vu-iterations', exec: 'hold', vus: BULKHEAD, iterations: 1,
      startTime: SATURATED_AT, maxDuration: '2m', tags: { series: 'holders' },
    },
    flood: rate('flood', FLOOD_RATE, `${SECONDS + 2}s`, 'flood'),
    api_saturated: rate('api', API_RATE, `${SECONDS + 2}s`, 'api_saturated'),
    health_saturated: rate('health', HEALTH_RATE, `${SECONDS + 2}s`, 'health_saturated'),
  },
  thresholds: {
    'http_req_failed{series:api_idle}': ['rate==0'],
    'http_req_failed{series:api_saturated}': ['rate==0'],
    'http_req_failed{series:health_idle}': ['rate==0'],
    'http_req_failed{series:health_saturated}': ['rate==0'],
    'checks{series:flood}': ['rate==1'],
    // Shown in the summary, to compare with each other.
    'http_req_duration{series:api_idle}': ['p(99)>=0'],
    'http_req_duration{series:api_saturated}': ['p(99)>=0'],
  },
};

export function api() {
  const res = http.get(`${BASE}/api/items`);
  check(res, { 'api 200': (r) => r.status === 200 });
}

export function health() {
  const res = http.get(`${BASE}/health`);
  check(res, { 'health 200': (r) => r.status === 200 });
}

export function hold() {
  const res = http.get(`${BASE}/legacy/reports?delay=${HOLD_DELAY}`, { timeout: '120s' });
  check(res, { 'holder 200': (r) => r.status === 200 });
}

export function flood() {
  const res = http.get(`${BASE}/legacy/reports?delay=1ms`, {
    responseCallback: http.expectedStatuses(503),
  });
  check(res, { 'flood 503': (r) => r.status === 503 });
}
