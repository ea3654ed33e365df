// k6 equivalent of `loadtest -scenario upload`: 8 concurrent uploads to the streamed upload route.
//
//   k6 run -e BASE=http://127.0.0.1:8080 -e SIZE_MB=200 -e UPLOADS=8 loadtest/k6/upload.js
//
// k6 cannot generate a request body on the fly: each VU builds its body once in memory
// (SIZE_MB each, so 8 x 200 MB needs 1.6 GB of RAM for k6) and sends it with a Content-Length.
// The Go scenario streams generated bodies and also sends them chunked. BASE must be a loopback
// address; the route is /legacy/upload (max_body_bytes 200 MiB in conf/routes.yaml).
import http from 'k6/http';
import { check } from 'k6';
import { Trend } from 'k6/metrics';

const BASE = __ENV.BASE || 'http://127.0.0.1:8080';
const SIZE_MB = parseInt(__ENV.SIZE_MB || '200', 10);
const UPLOADS = parseInt(__ENV.UPLOADS || '8', 10);

const mbps = new Trend('upload_mb_per_s');

export const options = {
  summaryTrendStats: ['avg', 'med', 'p(90)', 'p(99)', 'max'],
  scenarios: {
    upload: { executor: 'per-vu-iterations', vus: UPLOADS, iterations: 1, maxDuration: '5m' },
  },
  thresholds: {
    http_req_failed: ['rate==0'],
  },
};

const block = 'toron-loadtest-upload-0123456789abcdefghijklmnopqrstuvwxyz-ABCDEF\n'.repeat(16384); // 1 MiB

export default function () {
  const body = block.repeat(SIZE_MB).slice(0, SIZE_MB * 1000 * 1000);
  const res = http.post(`${BASE}/legacy/upload`, body, {
    headers: { 'Content-Type': 'application/octet-stream' },
    timeout: '300s',
    tags: { series: 'upload' },
  });
  check(res, {
    'status is 200': (r) => r.status === 200,
    'upstream received every byte': (r) => r.status === 200 && r.json('bytes') === body.length,
  });
  if (res.timings.duration > 0) {
    mbps.add(body.length / 1e6 / (res.timings.duration / 1000));
  }
}
