package demo

import (
	"fmt"
	"strconv"

	"github.com/valyala/fasthttp"
)

// trafficRoutesTemplate adds the demo's traffic-rule routes (SPEC 20); the %[1]s verb is the api
// upstream.
const trafficRoutesTemplate = `
  # Compression (SPEC 20): JSON compressed as it streams, zstd, br or gzip as the client asks.
  - type: upstream
    prefix: /api/catalog
    target: http://%[1]s
    compress: true

  # CORS at the edge: Toron answers the preflight itself (204, no upstream, no worker); the
  # answers to the allowed origin carry the CORS headers, and a response header is set.
  - type: upstream
    prefix: /api/public
    target: http://%[1]s
    cors: {allow_origins: ["https://app.example.com"], allow_methods: [GET, POST], allow_headers: [Content-Type], max_age: 10m}
    response_headers: {set: {X-Served-By: "toron {route}"}}

  # A redirect route: answered at routing, no upstream.
  - type: redirect
    prefix: /old-api
    to: "/api/users?from={path}"
    status: 301
`

// trafficBannerTemplate is the banner's part for the routes above; %[1]s is the gateway URL.
const trafficBannerTemplate = `
Traffic rules (SPEC 20):
  /api/catalog  -> api  compress: true; ?items=N answers N catalog items of JSON
  /api/public   -> api  cors for https://app.example.com; the preflight is answered by Toron
  /old-api      301 to /api/users, answered at routing

  # compressed JSON: compare the bytes on the wire (zstd, then gzip, then none)
  curl -s -H 'Accept-Encoding: zstd' -o /dev/null -w '%%{size_download} bytes zstd\n' '%[1]s/api/catalog?items=500'
  curl -s -H 'Accept-Encoding: gzip' -o /dev/null -w '%%{size_download} bytes gzip\n' '%[1]s/api/catalog?items=500'
  curl -s -o /dev/null -w '%%{size_download} bytes identity\n' '%[1]s/api/catalog?items=500'
  curl -s --compressed -D - -o /dev/null '%[1]s/api/catalog?items=500' | grep -iE 'content-encoding|vary|etag'

  # a CORS preflight answered 204 by Toron, then the actual request with its CORS headers
  curl -si -X OPTIONS -H 'Origin: https://app.example.com' -H 'Access-Control-Request-Method: POST' %[1]s/api/public/items | grep -iE '^HTTP|^access-control|^vary'
  curl -si -H 'Origin: https://app.example.com' %[1]s/api/public/items | grep -iE '^HTTP|^access-control|^vary|^x-served-by'

  # a redirect route
  curl -si '%[1]s/old-api/v1/users' | grep -iE '^HTTP|^location'
`

// RedirectBanner is the banner's line for the HTTPS redirect listener (-demo-tls): plain http on
// redirectURL is sent to gatewayURL.
func RedirectBanner(redirectURL, gatewayURL string) string {
	return fmt.Sprintf(`
HTTPS redirect listener (server.tls.http_redirect): plain http on %[1]s answers 308 to %[2]s
  curl -si %[1]s/api/users | grep -iE '^HTTP|^location'
  curl -s %[1]s/health
`, redirectURL, gatewayURL)
}

// catalogItem is one entry of the api upstream's ?items= answer.
type catalogItem struct {
	ID       int    `json:"id"`
	Name     string `json:"name"`
	Category string `json:"category"`
	Price    string `json:"price"`
	InStock  bool   `json:"in_stock"`
}

// maxCatalogItems caps ?items= (about 100 bytes each).
const maxCatalogItems = 100000

// serveCatalog answers ?items=N with N catalog items, a JSON document that compresses well. It
// reports false when the request did not ask for items.
func serveCatalog(ctx *fasthttp.RequestCtx) bool {
	v := ctx.QueryArgs().Peek("items")
	if v == nil {
		return false
	}
	n, err := strconv.Atoi(string(v))
	if err != nil || n < 0 || n > maxCatalogItems {
		writeError(ctx, fasthttp.StatusBadRequest, fmt.Sprintf("items must be a count from 0 to %d", maxCatalogItems))
		return true
	}
	categories := []string{"books", "garden", "kitchen", "toys"}
	items := make([]catalogItem, n)
	for i := range items {
		items[i] = catalogItem{ID: i + 1, Name: "item-" + strconv.Itoa(i+1), Category: categories[i%len(categories)],
			Price: strconv.Itoa(5+i%50) + ".99", InStock: i%3 != 0}
	}
	writeJSON(ctx, fasthttp.StatusOK, map[string]any{"service": "api", "count": n, "items": items})
	return true
}
