package conf

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"
)

// kind is the type of a configuration key as the operator writes it. It is derived from the
// Go type of the field carrying the key's koanf tag, so a field added to Server, Log or Route
// is known to the loader with no second list to keep in sync.
type kind int

const (
	kindString   kind = iota // string
	kindInt                  // int: a whole number
	kindSize                 // int64: bytes, a whole number or an IEC string such as "8MiB"
	kindFloat                // float64
	kindBool                 // bool
	kindDuration             // time.Duration: a Go duration string such as "5s"
	kindStrings              // []string: a YAML list of strings
	kindTLS                  // *TLS: the server.tls mapping (conf/tls.go)
	kindStrMap               // map[string]string: names to strings (conf/tracing.go)
	kindAuth                 // *Auth: a route's auth or server.auth_defaults (conf/auth.go)
)

// describe says what a value of the kind looks like, for error messages.
func (k kind) describe() string {
	if sub, ok := mappingSchemas[k]; ok {
		return describeMapping(sub)
	}
	switch k {
	case kindInt:
		return "an integer"
	case kindSize:
		return `a number of bytes or an IEC size such as "8KiB" or "200MiB"`
	case kindFloat:
		return "a number"
	case kindBool:
		return "true or false"
	case kindDuration:
		return `a Go duration such as "5s" or "1m30s"`
	case kindStrings:
		return "a list of strings"
	case kindTLS:
		return "a mapping with certs"
	case kindStrMap:
		return "a mapping of names to strings"
	case kindAuth:
		return `"default" or a mapping with one of basic, jwt, forward`
	default:
		return "a string"
	}
}

// schema maps each key of a section to its kind.
type schema map[string]kind

// Schemas of the three sections, from the koanf tags of their structs.
var (
	serverSchema = schemaOf(reflect.TypeFor[Server]())
	logSchema    = schemaOf(reflect.TypeFor[Log]())
	routeSchema  = schemaOf(reflect.TypeFor[Route]())
)

// schemaOf lists the koanf-tagged fields of struct type t. Pointer fields (route overrides)
// have the kind of what they point to.
func schemaOf(t reflect.Type) schema {
	s := make(schema)
	for f := range t.Fields() {
		tag := f.Tag.Get("koanf")
		if tag == "" || tag == "-" {
			continue
		}
		ft := f.Type
		if ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		switch {
		case ft == reflect.TypeFor[TLS]():
			s[tag] = kindTLS
		case ft == reflect.TypeFor[Auth]():
			s[tag] = kindAuth
		case ft == reflect.TypeFor[time.Duration]():
			s[tag] = kindDuration
		case ft.Kind() == reflect.String:
			s[tag] = kindString
		case ft.Kind() == reflect.Int:
			s[tag] = kindInt
		case ft.Kind() == reflect.Int64:
			// Every int64 key is a byte size (max_body_bytes, min_progress_bytes, ...).
			s[tag] = kindSize
		case ft.Kind() == reflect.Float64:
			s[tag] = kindFloat
		case ft.Kind() == reflect.Bool:
			s[tag] = kindBool
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.String:
			s[tag] = kindStrings
		case ft.Kind() == reflect.Map && ft.Key().Kind() == reflect.String && ft.Elem().Kind() == reflect.String:
			s[tag] = kindStrMap
		case ft.Kind() == reflect.Struct:
			s[tag] = mappingKind(ft)
		default:
			panic(fmt.Sprintf("BUG: conf: field %s.%s has unsupported type %s", t.Name(), f.Name, f.Type))
		}
	}
	return s
}

// keys returns the schema's keys, sorted.
func (s schema) keys() []string {
	out := make([]string, 0, len(s))
	for k := range s {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// suggest returns the known key closest to an unknown one when it is a likely typo
// (read_timout -> read_timeout), else "".
func (s schema) suggest(key string) string {
	best, bestDist := "", 3 // within two edits; further away is a guess, not a typo
	for _, k := range s.keys() {
		if d := editDistance(key, k); d < bestDist {
			best, bestDist = k, d
		}
	}
	return best
}

// unknownKey is the message for a key not in s: a suggestion for a likely typo, else the
// list of known keys.
func (s schema) unknownKey(key string) string {
	if best := s.suggest(key); best != "" {
		return fmt.Sprintf("unknown key (did you mean %s?)", best)
	}
	return "unknown key (known keys: " + strings.Join(s.keys(), ", ") + ")"
}

// editDistance is the Levenshtein distance between two short keys.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// fromYAML converts a value decoded by YAML into the Go type of kind k: int, int64,
// float64, bool, string, time.Duration or []string. It is strict on purpose: port: "8080"
// and read_timeout: 5 are errors, because a proxy that guesses what the operator meant
// (5 nanoseconds? seconds?) fails in production instead of at -check.
func fromYAML(v any, k kind) (any, error) {
	if v == nil {
		return nil, fmt.Errorf("has no value: write %s, or remove the key for the default", k.describe())
	}
	if sub, ok := mappingSchemas[k]; ok {
		return fromYAMLMapping(v, sub)
	}
	switch k {
	case kindString:
		if s, ok := v.(string); ok {
			return s, nil
		}
	case kindInt:
		if n, ok := yamlInt(v); ok {
			if n < math.MinInt || n > math.MaxInt {
				return nil, fmt.Errorf("%d is too large", n)
			}
			return int(n), nil
		}
		if _, ok := v.(uint64); ok {
			return nil, fmt.Errorf("%v is too large", v)
		}
	case kindSize:
		if n, ok := yamlInt(v); ok {
			return n, nil
		}
		switch x := v.(type) {
		case uint64:
			return nil, fmt.Errorf("%d is too large", x)
		case string:
			return parseSize(x)
		}
	case kindFloat:
		switch x := v.(type) {
		case float64:
			return x, nil
		case int:
			return float64(x), nil
		}
	case kindBool:
		if b, ok := v.(bool); ok {
			return b, nil
		}
	case kindDuration:
		if s, ok := v.(string); ok {
			return parseDuration(s)
		}
		if _, ok := yamlInt(v); ok {
			return nil, fmt.Errorf("%v has no unit: write %s", v, k.describe())
		}
	case kindTLS:
		return decodeTLS(v)
	case kindStrMap:
		return decodeStringMap(v)
	case kindAuth:
		return decodeAuth(v)
	case kindStrings:
		list, ok := v.([]any)
		if !ok {
			break
		}
		out := make([]string, 0, len(list))
		for i, item := range list {
			s, ok := item.(string)
			if !ok {
				return nil, fmt.Errorf("item %d (%s) must be a string", i, yamlLiteral(item))
			}
			out = append(out, s)
		}
		return out, nil
	}
	return nil, fmt.Errorf("must be %s, not %s", k.describe(), yamlLiteral(v))
}

// yamlInt reports whether v is a YAML integer that fits an int64.
func yamlInt(v any) (int64, bool) {
	switch x := v.(type) {
	case int:
		return int64(x), true
	case int64:
		return x, true
	case uint64:
		if x <= math.MaxInt64 {
			return int64(x), true
		}
	}
	return 0, false
}

// yamlLiteral shows a decoded YAML value with its type, for error messages.
func yamlLiteral(v any) string {
	switch x := v.(type) {
	case string:
		return strconv.Quote(x)
	case bool:
		return "the boolean " + strconv.FormatBool(x)
	case int, int64, uint64, float64:
		return fmt.Sprintf("the number %v", x)
	case []any:
		return "a list"
	case map[string]any, map[any]any:
		return "a mapping"
	default:
		return fmt.Sprintf("%v", x)
	}
}

// fromEnv converts the text of an environment variable into the Go type of kind k. Unlike
// YAML, every environment value is text, so here "8080" is an integer.
func fromEnv(s string, k kind) (any, error) {
	var v any
	var err error
	switch k {
	case kindString:
		return s, nil
	case kindInt:
		v, err = strconv.Atoi(s)
	case kindSize:
		return parseSize(s)
	case kindFloat:
		var f float64
		if f, err = strconv.ParseFloat(s, 64); err == nil && (math.IsNaN(f) || math.IsInf(f, 0)) {
			err = errors.New("not finite")
		}
		v = f
	case kindBool:
		v, err = strconv.ParseBool(s)
	case kindDuration:
		return parseDuration(s)
	case kindStrings:
		return envList(s), nil
	case kindStrMap:
		return envStringMap(s)
	default:
		// A mapping is set key by key (TORON_SERVER__PROXY_PROTOCOL__ENABLED).
		return nil, fmt.Errorf("cannot be set from the environment")
	}
	if err != nil {
		return nil, fmt.Errorf("%q is not %s", s, k.describe())
	}
	return v, nil
}

// parseDuration parses a Go duration; a bare number has no unit and is refused.
func parseDuration(s string) (time.Duration, error) {
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		return 0, fmt.Errorf("%q is not %s", s, kindDuration.describe())
	}
	return d, nil
}

// iecUnits are the accepted size suffixes. SI suffixes (KB, MB) are refused rather than
// guessed: nginx reads 1m as MiB, Kubernetes reads 1M as 10^6, and a body limit that is off
// by 5% is a surprise at the worst moment.
var iecUnits = []struct {
	suffix string
	factor int64
}{
	{"KiB", 1 << 10},
	{"MiB", 1 << 20},
	{"GiB", 1 << 30},
	{"TiB", 1 << 40},
	{"B", 1},
}

// parseSize parses a byte size: a whole number of bytes ("1024", "-1") or a whole number
// with an IEC suffix ("8KiB", "200MiB", "1 GiB"). The suffix is case-insensitive. A negative
// size parses, so that the caller reports "must not be negative" like for a YAML integer.
func parseSize(s string) (int64, error) {
	text := strings.TrimSpace(s)
	factor := int64(1)
	for _, u := range iecUnits {
		if len(text) > len(u.suffix) && strings.EqualFold(text[len(text)-len(u.suffix):], u.suffix) {
			text = strings.TrimSpace(text[:len(text)-len(u.suffix)])
			factor = u.factor
			break
		}
	}
	n, err := strconv.ParseInt(text, 10, 64)
	if err != nil {
		if errors.Is(err, strconv.ErrRange) {
			return 0, fmt.Errorf("%q is too large", s)
		}
		return 0, fmt.Errorf("%q is not %s (IEC units only: B, KiB, MiB, GiB, TiB)", s, kindSize.describe())
	}
	if n > math.MaxInt64/factor || n < math.MinInt64/factor {
		return 0, fmt.Errorf("%q is too large", s)
	}
	return n * factor, nil
}
