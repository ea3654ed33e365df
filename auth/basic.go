package auth

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
	"golang.org/x/crypto/bcrypt"
)

// Defaults of basic auth (SPEC 19).
const (
	// BasicCacheTTL is how long a verified credential is trusted without bcrypt: at most 5
	// minutes, so that a password removed from the users file (and reloaded) or a revoked
	// credential stops working soon, while a browser re-sending it on every request costs one
	// bcrypt per 5 minutes instead of one per request (~50 ms of CPU at cost 10).
	BasicCacheTTL = 5 * time.Minute
	// BasicCacheMaxEntries bounds the verified credentials of one route.
	BasicCacheMaxEntries = 10_000
	// BasicHashWait is how long a request waits for a bcrypt slot before its 503 auth_busy.
	BasicHashWait = 100 * time.Millisecond
	// maxBasicCredentialBytes bounds the decoded user:password; longer is refused unread
	// (bcrypt reads at most 72 bytes of a password anyway).
	maxBasicCredentialBytes = 512
)

// HashLimiter bounds the bcrypt comparisons running at once, process-wide: a flood of wrong
// passwords can take at most its slots' worth of CPU, on every route together.
type HashLimiter struct {
	slots chan struct{}
	wait  time.Duration
}

// NewHashLimiter returns a limiter of n slots (at least 1) whose waiters give up after wait.
func NewHashLimiter(n int, wait time.Duration) *HashLimiter {
	return &HashLimiter{slots: make(chan struct{}, max(1, n)), wait: wait}
}

// sharedHashLimiter is the process's limiter: HashSlots slots, BasicHashWait. It is sized on
// first use, after main has settled GOMAXPROCS (procs.go may raise it at start).
var sharedHashLimiter = sync.OnceValue(func() *HashLimiter {
	return NewHashLimiter(HashSlots(runtime.GOMAXPROCS(0), runtime.NumCPU()), BasicHashWait)
})

// HashSlots is how many bcrypt comparisons may run at once in a process of procs Ps
// (GOMAXPROCS) on cpus CPUs: one fewer than the CPUs it can use, at least one, and never more
// than GOMAXPROCS (SPEC 19's bound).
//
// Why one fewer: a comparison at cost 10 runs tens of milliseconds without blocking, and the
// Go scheduler takes a P from a running goroutine only every 10 ms. With GOMAXPROCS slots a
// flood of wrong passwords holds every P, and each request of another route waits for such a
// preemption: measured with the load test's auth-flood scenario on 2 CPUs (a shared machine,
// builds interleaved), 2 slots put /api's p99 under the flood at 43-120 ms in every round
// (17-30x idle), 1 slot at 2.5-17 ms (1.3-2.2x; docs/access-control.md). With one P
// always free of bcrypt, the other routes are scheduled at once; the flood gets the rest of
// the machine, and its excess the 503. (Running each comparison on its own thread at nice 19
// was tried and dropped: a starved thread that holds a P delays every stop-the-world of the
// GC, and /api's p99 reached 117 ms.)
func HashSlots(procs, cpus int) int {
	return max(1, min(procs, cpus)-1)
}

// acquire takes a slot, waiting at most l.wait; false means none freed up.
func (l *HashLimiter) acquire() bool {
	select {
	case l.slots <- struct{}{}:
		return true
	default:
	}
	t := time.NewTimer(l.wait)
	defer t.Stop()
	select {
	case l.slots <- struct{}{}:
		return true
	case <-t.C:
		return false
	}
}

// release gives a slot back.
func (l *HashLimiter) release() { <-l.slots }

// BasicOptions configures a Basic.
type BasicOptions struct {
	// UsersFile is the htpasswd file of bcrypt hashes. Required.
	UsersFile string
	// Realm is the realm of the challenge; "" means "toron".
	Realm string
	// Limiter bounds concurrent bcrypt checks; nil means the process-wide one (HashSlots
	// slots, BasicHashWait).
	Limiter *HashLimiter
	// CacheTTL is how long a verified credential is cached; 0 means BasicCacheTTL.
	CacheTTL time.Duration
}

// Basic is HTTP Basic authentication against an htpasswd file of bcrypt hashes.
//
// A verified credential is cached by the SHA-256 of "user:password", never the plaintext, so
// bcrypt runs once per credential per CacheTTL. A credential not in the cache waits for a
// slot of the HashLimiter (at most its wait), on the caller's goroutine: the gateway calls
// Check from its header hook, which runs on the connection's goroutine before a worker or a
// route slot is taken, so the wait holds neither.
type Basic struct {
	users map[string][]byte
	// decoy is the hash an unknown user's password is compared against (the file's first), so
	// that a wrong user name costs the same bcrypt time as a wrong password and the answer's
	// timing does not tell which users exist.
	decoy     []byte
	challenge string
	limiter   *HashLimiter
	ttl       time.Duration
	cache     *cache[[sha256.Size]byte, struct{}]
	hashes    atomic.Int64
}

// NewBasic reads o.UsersFile and returns its Basic.
func NewBasic(o BasicOptions) (*Basic, error) {
	data, err := os.ReadFile(o.UsersFile)
	if err != nil {
		return nil, fmt.Errorf("auth: cannot read users file: %w", err)
	}
	users, err := ParseHtpasswd(o.UsersFile, data)
	if err != nil {
		return nil, err
	}
	var decoy []byte
	for _, line := range strings.Split(string(data), "\n") {
		if user, _, ok := strings.Cut(line, ":"); ok && users[user] != nil {
			decoy = users[user]
			break
		}
	}
	realm := o.Realm
	if realm == "" {
		realm = "toron"
	}
	b := &Basic{
		users:     users,
		decoy:     decoy,
		challenge: `Basic realm="` + strings.NewReplacer(`"`, `'`, `\`, `/`).Replace(realm) + `", charset="UTF-8"`,
		limiter:   o.Limiter,
		ttl:       o.CacheTTL,
		cache:     newCache[[sha256.Size]byte, struct{}](BasicCacheMaxEntries),
	}
	if b.limiter == nil {
		b.limiter = sharedHashLimiter()
	}
	if b.ttl <= 0 {
		b.ttl = BasicCacheTTL
	}
	return b, nil
}

// IsBcryptHash reports whether hash is a bcrypt hash Toron accepts: $2y$, $2a$ or $2b$.
func IsBcryptHash(hash string) bool {
	if len(hash) != 60 {
		return false
	}
	switch hash[:4] {
	case "$2y$", "$2a$", "$2b$":
	default:
		return false
	}
	_, err := bcrypt.Cost([]byte(hash))
	return err == nil
}

// ParseHtpasswd parses an htpasswd file: one "user:hash" a line, blank lines and lines
// starting with # ignored. Every hash must be bcrypt; another scheme (MD5 $apr1$, SHA {SHA},
// crypt, plain text) is an error naming the file and the line.
func ParseHtpasswd(name string, data []byte) (map[string][]byte, error) {
	users := make(map[string][]byte)
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimRight(line, "\r")
		if t := strings.TrimSpace(line); t == "" || t[0] == '#' {
			continue
		}
		user, hash, ok := strings.Cut(line, ":")
		switch {
		case !ok || user == "":
			return nil, fmt.Errorf("auth: users file %s line %d: must be user:bcrypt-hash (htpasswd -B)", name, i+1)
		case !IsBcryptHash(hash):
			return nil, fmt.Errorf("auth: users file %s line %d: user %q: not a bcrypt hash ($2y$, $2a$ or $2b$); create it with htpasswd -B", name, i+1, user)
		case users[user] != nil:
			return nil, fmt.Errorf("auth: users file %s line %d: user %q appears twice", name, i+1, user)
		}
		users[user] = []byte(hash)
	}
	if len(users) == 0 {
		return nil, fmt.Errorf("auth: users file %s has no users", name)
	}
	return users, nil
}

// Check decides a request's Authorization: Basic credential.
func (b *Basic) Check(in *Input) Verdict {
	raw := in.Header.Peek(fasthttp.HeaderAuthorization)
	if len(raw) == 0 {
		return unauthorized(b.challenge, bodyCredRequired)
	}
	enc, ok := cutScheme(raw, "basic")
	if !ok || base64.StdEncoding.DecodedLen(len(enc)) > maxBasicCredentialBytes {
		return unauthorized(b.challenge, bodyCredInvalid)
	}
	var buf [maxBasicCredentialBytes]byte
	n, err := base64.StdEncoding.Decode(buf[:], enc)
	if err != nil {
		return unauthorized(b.challenge, bodyCredInvalid)
	}
	cred := buf[:n]
	key := sha256.Sum256(cred)
	now := in.now()
	if _, ok := b.cache.get(key, now); ok {
		return Verdict{}
	}
	user, pass, ok := bytes.Cut(cred, []byte{':'})
	if !ok {
		return unauthorized(b.challenge, bodyCredInvalid)
	}
	hash, known := b.users[string(user)]
	if !known {
		hash = b.decoy
	}
	if !b.limiter.acquire() {
		return VerdictBusy
	}
	b.hashes.Add(1)
	err = bcrypt.CompareHashAndPassword(hash, pass)
	b.limiter.release()
	if err != nil || !known {
		return unauthorized(b.challenge, bodyCredInvalid)
	}
	b.cache.put(key, struct{}{}, now.Add(b.ttl), now)
	return Verdict{}
}

// Hashes is the number of bcrypt comparisons b has run.
func (b *Basic) Hashes() int64 { return b.hashes.Load() }

// Prepare removes the credential: the upstream never sees the password (SPEC 19).
func (b *Basic) Prepare(h *fasthttp.RequestHeader, v *Verdict) {
	h.Del(fasthttp.HeaderAuthorization)
}

// Close does nothing: Basic has no background work.
func (b *Basic) Close() {}

// cutScheme returns the credentials after an Authorization scheme (case-insensitive, RFC 9110
// 11.1) and the spaces that follow it.
func cutScheme(v []byte, scheme string) ([]byte, bool) {
	if len(v) <= len(scheme) || v[len(scheme)] != ' ' || !strings.EqualFold(string(v[:len(scheme)]), scheme) {
		return nil, false
	}
	return bytes.TrimLeft(v[len(scheme):], " "), true
}

var _ Checker = (*Basic)(nil)
