package auth

import (
	"encoding/base64"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/valyala/fasthttp"
	"golang.org/x/crypto/bcrypt"
)

// usersFile writes an htpasswd file of bcrypt hashes (minimum cost, for speed).
func usersFile(t testing.TB, users ...string) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("# users\n\n")
	for i := 0; i+1 < len(users); i += 2 {
		h, err := bcrypt.GenerateFromPassword([]byte(users[i+1]), bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		b.WriteString(users[i] + ":" + string(h) + "\n")
	}
	return writeFile(t, "users", []byte(b.String()))
}

// newBasic is NewBasic(o), which must succeed, closed when the test ends.
func newBasic(t testing.TB, o BasicOptions) *Basic {
	t.Helper()
	b, err := NewBasic(o)
	return closedAtEnd(t, b, err)
}

func basicHeader(user, pass string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))
}

func TestBasicAcceptsGoodRefusesBad(t *testing.T) {
	b := newBasic(t, BasicOptions{UsersFile: usersFile(t, "alice", "s3cret", "bob", "hunter2"), Realm: "ops"})
	cases := []struct {
		name, auth string
		want       Outcome
		body       string
	}{
		{"good", basicHeader("alice", "s3cret"), Pass, ""},
		{"second user", basicHeader("bob", "hunter2"), Pass, ""},
		{"case-insensitive scheme", "bAsIc " + base64.StdEncoding.EncodeToString([]byte("alice:s3cret")), Pass, ""},
		{"wrong password", basicHeader("alice", "nope"), Unauthorized, "Invalid credentials"},
		{"unknown user", basicHeader("mallory", "s3cret"), Unauthorized, "Invalid credentials"},
		{"other user's password", basicHeader("bob", "s3cret"), Unauthorized, "Invalid credentials"},
		{"missing", "", Unauthorized, "Credentials required"},
		{"bearer", "Bearer abc", Unauthorized, "Invalid credentials"},
		{"not base64", "Basic !!!", Unauthorized, "Invalid credentials"},
		{"no colon", "Basic " + base64.StdEncoding.EncodeToString([]byte("alice")), Unauthorized, "Invalid credentials"},
		{"huge", "Basic " + strings.Repeat("QUFB", 400), Unauthorized, "Invalid credentials"},
	}
	for _, c := range cases {
		in := input()
		if c.auth != "" {
			in = input("Authorization", c.auth)
		}
		v := b.Check(in)
		if v.Outcome != c.want {
			t.Errorf("%s: %v, want outcome %d", c.name, v, c.want)
			continue
		}
		if c.want == Unauthorized {
			if v.Status != 401 || v.Challenge != `Basic realm="ops", charset="UTF-8"` || v.Reason() != "unauthorized" ||
				string(v.Body) != `{"error":"401 Unauthorized: `+c.body+`"}` {
				t.Errorf("%s: 401 verdict %+v body %s", c.name, v, v.Body)
			}
		}
	}
}

func TestBasicCacheRunsBcryptOncePerCredential(t *testing.T) {
	b := newBasic(t, BasicOptions{UsersFile: usersFile(t, "alice", "s3cret")})
	for range 20 {
		if v := b.Check(input("Authorization", basicHeader("alice", "s3cret"))); v.Outcome != Pass {
			t.Fatal(v)
		}
	}
	if n := b.Hashes(); n != 1 {
		t.Errorf("bcrypt ran %d times for one credential, want 1", n)
	}
	// A wrong password is never cached: each try pays its bcrypt (and its slot).
	for range 3 {
		b.Check(input("Authorization", basicHeader("alice", "wrong")))
	}
	if n := b.Hashes(); n != 4 {
		t.Errorf("bcrypt ran %d times, want 4", n)
	}
	// The cache holds hashes, never the password.
	b.cache.mu.RLock()
	for k := range b.cache.entries {
		if strings.Contains(string(k[:]), "s3cret") {
			t.Error("the cache key holds the plaintext")
		}
	}
	b.cache.mu.RUnlock()
}

func TestBasicCacheExpires(t *testing.T) {
	b := newBasic(t, BasicOptions{UsersFile: usersFile(t, "alice", "s3cret"), CacheTTL: 50 * time.Millisecond})
	b.Check(input("Authorization", basicHeader("alice", "s3cret")))
	time.Sleep(100 * time.Millisecond)
	b.Check(input("Authorization", basicHeader("alice", "s3cret")))
	if n := b.Hashes(); n != 2 {
		t.Errorf("bcrypt ran %d times across the TTL, want 2", n)
	}
}

func TestBasicBusyWhenHashSlotsTaken(t *testing.T) {
	lim := NewHashLimiter(1, 30*time.Millisecond)
	b := newBasic(t, BasicOptions{UsersFile: usersFile(t, "alice", "s3cret"), Limiter: lim})
	// A cached credential needs no slot.
	if v := b.Check(input("Authorization", basicHeader("alice", "s3cret"))); v.Outcome != Pass {
		t.Fatal(v)
	}
	if !lim.acquire() {
		t.Fatal("slot not free")
	}
	start := time.Now()
	v := b.Check(input("Authorization", basicHeader("alice", "other")))
	waited := time.Since(start)
	if v.Outcome != Busy || v.Status != 503 || v.RetryAfter() != "1" || v.Reason() != "auth_busy" ||
		string(v.Body) != `{"error":"503 Service Unavailable: Authentication busy"}` {
		t.Errorf("verdict with every slot taken: %+v", v)
	}
	if waited < 25*time.Millisecond || waited > 2*time.Second {
		t.Errorf("waited %s for a slot, want about 30ms", waited)
	}
	if v := b.Check(input("Authorization", basicHeader("alice", "s3cret"))); v.Outcome != Pass {
		t.Errorf("cached credential while slots are taken: %v", v)
	}
	lim.release()
	if v := b.Check(input("Authorization", basicHeader("alice", "other"))); v.Outcome != Unauthorized {
		t.Errorf("after the slot freed: %v", v)
	}
}

func TestBasicHashConcurrencyBounded(t *testing.T) {
	lim := NewHashLimiter(2, time.Second)
	b := newBasic(t, BasicOptions{UsersFile: usersFile(t, "alice", "s3cret"), Limiter: lim})
	var wg sync.WaitGroup
	var mu sync.Mutex
	peak := 0
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			mu.Lock()
			peak = max(peak, len(lim.slots))
			mu.Unlock()
		}
	}()
	for range 8 {
		wg.Go(func() { b.Check(input("Authorization", basicHeader("alice", "wrong"))) })
	}
	wg.Wait()
	close(stop)
	mu.Lock()
	defer mu.Unlock()
	if peak > 2 {
		t.Errorf("%d hashes ran at once, limit 2", peak)
	}
}

func TestParseHtpasswdRefusesOtherSchemes(t *testing.T) {
	good, _ := bcrypt.GenerateFromPassword([]byte("x"), bcrypt.MinCost)
	cases := []struct {
		file, want string
	}{
		{"alice:" + string(good) + "\nbob:$apr1$abc$def\n", "line 2: user \"bob\": not a bcrypt hash"},
		{"carol:{SHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g=\n", "line 1: user \"carol\": not a bcrypt hash"},
		{"dave:plain\n", "line 1"},
		{"no-colon\n", "line 1: must be user:bcrypt-hash"},
		{"# only comments\n", "has no users"},
		{"a:" + string(good) + "\na:" + string(good) + "\n", "line 2: user \"a\" appears twice"},
	}
	for _, c := range cases {
		_, err := ParseHtpasswd("users.htpasswd", []byte(c.file))
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "users.htpasswd") {
			t.Errorf("%q: error %v, want it to name the file and %q", c.file, err, c.want)
		}
	}
	for _, prefix := range []string{"$2a$", "$2b$", "$2y$"} {
		h := prefix + string(good[4:])
		if _, err := ParseHtpasswd("u", []byte("x:"+h+"\r\n")); err != nil {
			t.Errorf("%s: %v", prefix, err)
		}
	}
}

func TestBasicPrepareRemovesCredential(t *testing.T) {
	b := newBasic(t, BasicOptions{UsersFile: usersFile(t, "alice", "s3cret")})
	in := input("Authorization", basicHeader("alice", "s3cret"))
	v := b.Check(in)
	b.Prepare(in.Header, &v)
	if len(in.Header.Peek(fasthttp.HeaderAuthorization)) != 0 {
		t.Error("Authorization is forwarded")
	}
}

// TestCachesUseTheRequestTime: a cached credential or token is checked against the request's
// arrival time (Input.Now), without a clock read of its own; past the entry's expiry by that time
// it is verified again.
func TestCachesUseTheRequestTime(t *testing.T) {
	b := newBasic(t, BasicOptions{UsersFile: usersFile(t, "alice", "s3cret"), CacheTTL: time.Minute})
	t0 := time.Now()
	in := input("Authorization", basicHeader("alice", "s3cret"))
	for i, at := range []time.Duration{0, 30 * time.Second, 2 * time.Minute} {
		in.Now = t0.Add(at)
		if v := b.Check(in); v.Outcome != Pass {
			t.Fatalf("check %d: %v", i, v)
		}
	}
	if n := b.Hashes(); n != 2 {
		t.Errorf("bcrypt ran %d times (a request 30 s later from the cache, one 2 min later past the 1 min TTL), want 2", n)
	}
	j := fileJWT(t, JWTOptions{})
	tok := bearer(sign(t, jwt.SigningMethodES256, "e", ecKey, claims(nil)))
	for i, at := range []time.Duration{0, time.Minute, 2 * JWTCacheMaxTTL} {
		tok.Now = t0.Add(at)
		if v := j.Check(tok); v.Outcome != Pass {
			t.Fatalf("jwt check %d: %v", i, v)
		}
	}
	if n := j.Verifies(); n != 2 {
		t.Errorf("verified %d times (a minute later from the cache, past JWTCacheMaxTTL again), want 2", n)
	}
}

func TestHashSlotsLeaveOneCPU(t *testing.T) {
	for _, c := range []struct{ procs, cpus, want int }{
		{1, 1, 1}, // the one CPU: nothing to leave
		{2, 1, 1}, // procs.go's two Ps on one CPU
		{2, 2, 1},
		{4, 4, 3},
		{2, 8, 1}, // GOMAXPROCS=2 on a larger machine: one P stays free
		{8, 2, 1}, // more Ps than CPUs: the CPUs count
	} {
		if got := HashSlots(c.procs, c.cpus); got != c.want {
			t.Errorf("HashSlots(%d Ps, %d CPUs) = %d, want %d", c.procs, c.cpus, got, c.want)
		}
	}
}
