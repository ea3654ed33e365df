package auth

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Bounds of the JWKS fetcher (SPEC 19).
const (
	// DefaultJWKSRefresh is how often a jwks_url is fetched again: IdPs publish a new key well
	// before they sign with it, and rotate over days, so minutes are plenty.
	DefaultJWKSRefresh = 5 * time.Minute
	// JWKSUnknownKidInterval is the least time between two fetches caused by unknown kids, so
	// that tokens with made-up kids cannot turn Toron into a flood against the IdP.
	JWKSUnknownKidInterval = 30 * time.Second
	// JWKSFetchTimeout bounds one fetch of a jwks_url, connection and body included.
	JWKSFetchTimeout = 5 * time.Second
	// JWKSStartWait bounds the fetch when a route is built (start and reload): past it the
	// route serves, refusing tokens until the fetch (which goes on) brings keys.
	JWKSStartWait = 2 * time.Second
	// maxJWKSBytes bounds a JWKS document; real ones are a few KiB.
	maxJWKSBytes = 1 << 20
)

// jwk is one usable key of a JWKS.
type jwk struct {
	kid string
	// alg is the key's own "alg", "" when it has none; a token must then use it.
	alg string
	// key is *rsa.PublicKey, *ecdsa.PublicKey, ed25519.PublicKey or []byte (kty oct).
	key any
}

// keySet is a parsed JWKS.
type keySet struct {
	byKID map[string]*jwk
	all   []*jwk
}

// find returns the key for kid; a token without kid may use the only key of a one-key set.
func (s *keySet) find(kid string) *jwk {
	if s == nil {
		return nil
	}
	if kid == "" {
		if len(s.all) == 1 {
			return s.all[0]
		}
		return nil
	}
	return s.byKID[kid]
}

// rawJWK is the JSON of one key (RFC 7517, RFC 7518 6, RFC 8037).
type rawJWK struct {
	Kty string `json:"kty"`
	Kid string `json:"kid"`
	Alg string `json:"alg"`
	Use string `json:"use"`
	N   string `json:"n"`
	E   string `json:"e"`
	Crv string `json:"crv"`
	X   string `json:"x"`
	Y   string `json:"y"`
	K   string `json:"k"`
}

// ParseJWKS parses a JWK Set and returns how many signature keys it holds. Keys for
// encryption (use "enc") and of unknown types are skipped; a set left with no key is an error.
func ParseJWKS(data []byte) (int, error) {
	s, err := parseJWKS(data)
	if err != nil {
		return 0, err
	}
	return len(s.all), nil
}

// parseJWKS parses a JWK Set into its usable keys.
func parseJWKS(data []byte) (*keySet, error) {
	var doc struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("auth: JWKS is not a JSON JWK Set: %w", err)
	}
	s := &keySet{byKID: make(map[string]*jwk)}
	var errs []error
	for i, raw := range doc.Keys {
		var r rawJWK
		if err := json.Unmarshal(raw, &r); err != nil {
			errs = append(errs, fmt.Errorf("key %d: %w", i, err))
			continue
		}
		if r.Use != "" && r.Use != "sig" {
			continue
		}
		key, err := r.publicKey()
		if err != nil {
			errs = append(errs, fmt.Errorf("key %d (kid %q): %w", i, r.Kid, err))
			continue
		}
		if key == nil {
			continue
		}
		k := &jwk{kid: r.Kid, alg: r.Alg, key: key}
		if r.Kid != "" {
			if _, dup := s.byKID[r.Kid]; dup {
				errs = append(errs, fmt.Errorf("key %d: kid %q appears twice", i, r.Kid))
				continue
			}
			s.byKID[r.Kid] = k
		}
		s.all = append(s.all, k)
	}
	if len(s.all) == 0 {
		if len(errs) > 0 {
			return nil, fmt.Errorf("auth: JWKS has no usable signature key: %w", errors.Join(errs...))
		}
		return nil, errors.New("auth: JWKS has no signature key (keys of kty RSA, EC, OKP or oct)")
	}
	return s, nil
}

// publicKey decodes the key material; nil, nil for a key type Toron does not use.
func (r *rawJWK) publicKey() (any, error) {
	b64 := base64.RawURLEncoding
	switch r.Kty {
	case "RSA":
		n, err1 := b64.DecodeString(r.N)
		e, err2 := b64.DecodeString(r.E)
		if err := errors.Join(err1, err2); err != nil || len(n) == 0 || len(e) == 0 || len(e) > 4 {
			return nil, errors.New("RSA key needs base64url n and e")
		}
		exp := new(big.Int).SetBytes(e)
		pub := &rsa.PublicKey{N: new(big.Int).SetBytes(n), E: int(exp.Int64())}
		if pub.N.BitLen() < 2048 {
			return nil, fmt.Errorf("RSA key of %d bits: at least 2048 are needed", pub.N.BitLen())
		}
		return pub, nil
	case "EC":
		var curve elliptic.Curve
		switch r.Crv {
		case "P-256":
			curve = elliptic.P256()
		case "P-384":
			curve = elliptic.P384()
		case "P-521":
			curve = elliptic.P521()
		default:
			return nil, fmt.Errorf("EC curve %q: use P-256, P-384 or P-521", r.Crv)
		}
		x, err1 := b64.DecodeString(r.X)
		y, err2 := b64.DecodeString(r.Y)
		size := (curve.Params().BitSize + 7) / 8
		if errors.Join(err1, err2) != nil || len(x) != size || len(y) != size {
			return nil, fmt.Errorf("EC key needs base64url x and y of %d bytes", size)
		}
		point := append(append([]byte{4}, x...), y...)
		pub, err := ecdsa.ParseUncompressedPublicKey(curve, point)
		if err != nil {
			return nil, fmt.Errorf("EC key: %w", err)
		}
		return pub, nil
	case "OKP":
		if r.Crv != "Ed25519" {
			return nil, nil
		}
		x, err := b64.DecodeString(r.X)
		if err != nil || len(x) != ed25519.PublicKeySize {
			return nil, errors.New("Ed25519 key needs a base64url x of 32 bytes")
		}
		return ed25519.PublicKey(x), nil
	case "oct":
		k, err := b64.DecodeString(r.K)
		if err != nil || len(k) < 32 {
			return nil, errors.New("oct key needs a base64url k of at least 32 bytes")
		}
		return k, nil
	}
	return nil, nil
}

// jwksSource holds a route's keys: from a file (loaded once; a reload builds a new source) or
// from a URL, fetched at start, every refresh and on an unknown kid, keeping the last good keys
// when a fetch fails.
type jwksSource struct {
	keys atomic.Pointer[keySet]

	url     string
	client  *http.Client
	refresh time.Duration
	onError func(error)
	// kidEvery is the least time between fetches caused by unknown kids.
	kidEvery time.Duration

	mu        sync.Mutex
	lastFetch time.Time
	inflight  chan struct{} // closed when the fetch in progress ends; nil when none is
	kick      chan struct{}
	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

// fileSource loads a JWKS file.
func fileSource(path string) (*jwksSource, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("auth: cannot read jwks_file: %w", err)
	}
	ks, err := parseJWKS(data)
	if err != nil {
		return nil, fmt.Errorf("%w (jwks_file %s)", err, path)
	}
	s := &jwksSource{}
	s.keys.Store(ks)
	return s, nil
}

// urlSource starts fetching url: once now (waiting at most JWKSStartWait), then in the
// background every refresh and on request (refreshSoon). onError hears every failed fetch.
func urlSource(url string, refresh, kidEvery time.Duration, onError func(error)) *jwksSource {
	if refresh <= 0 {
		refresh = DefaultJWKSRefresh
	}
	if kidEvery <= 0 {
		kidEvery = JWKSUnknownKidInterval
	}
	s := &jwksSource{
		kidEvery: kidEvery,
		url:      url,
		client:   &http.Client{Timeout: JWKSFetchTimeout},
		refresh:  refresh,
		onError:  onError,
		kick:     make(chan struct{}, 1),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	first := s.begin(time.Now())
	go s.loop()
	s.kick <- struct{}{}
	t := time.NewTimer(JWKSStartWait)
	defer t.Stop()
	select {
	case <-first:
	case <-t.C:
	}
	return s
}

// loop fetches on every tick and kick until close.
func (s *jwksSource) loop() {
	defer close(s.done)
	tick := time.NewTicker(s.refresh)
	defer tick.Stop()
	for {
		select {
		case <-s.stop:
			s.end()
			return
		case <-tick.C:
			s.begin(time.Now())
			s.fetch()
		case <-s.kick:
			s.fetch()
		}
	}
}

// begin marks a fetch as in progress and returns the channel closed when it ends.
func (s *jwksSource) begin(now time.Time) chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inflight == nil {
		s.inflight = make(chan struct{})
	}
	s.lastFetch = now
	return s.inflight
}

// end marks the fetch in progress as ended, waking its waiters.
func (s *jwksSource) end() {
	s.mu.Lock()
	ch := s.inflight
	s.inflight = nil
	s.mu.Unlock()
	if ch != nil {
		close(ch)
	}
}

// fetch gets the JWKS once; a failure keeps the keys in force and is reported.
func (s *jwksSource) fetch() {
	defer s.end()
	ks, err := s.get()
	if err != nil {
		if s.onError != nil {
			s.onError(fmt.Errorf("auth: jwks_url %s: %w (the last good keys stay in force)", s.url, err))
		}
		return
	}
	s.keys.Store(ks)
}

// get fetches and parses the JWKS, stopping at close.
func (s *jwksSource) get() (*keySet, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-s.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/jwk-set+json, application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("status %d", resp.StatusCode)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxJWKSBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxJWKSBytes {
		return nil, fmt.Errorf("JWKS larger than %d bytes", maxJWKSBytes)
	}
	return parseJWKS(data)
}

// refreshSoon asks for a fetch because of an unknown kid, at most every
// JWKSUnknownKidInterval. It returns a channel closed when the fetch ends, or nil when no fetch
// is in progress or allowed (a file source, or too soon after the last).
func (s *jwksSource) refreshSoon(now time.Time) <-chan struct{} {
	if s.url == "" {
		return nil
	}
	s.mu.Lock()
	if ch := s.inflight; ch != nil {
		s.mu.Unlock()
		return ch
	}
	if now.Sub(s.lastFetch) < s.kidEvery {
		s.mu.Unlock()
		return nil
	}
	s.mu.Unlock()
	ch := s.begin(now)
	select {
	case s.kick <- struct{}{}:
	default:
	}
	return ch
}

// close stops the background fetches and waits for the loop to end.
func (s *jwksSource) close() {
	if s.stop == nil {
		return
	}
	s.closeOnce.Do(func() { close(s.stop) })
	<-s.done
	s.client.CloseIdleConnections()
}
