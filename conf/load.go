package conf

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"sort"
	"strings"

	"github.com/go-viper/mapstructure/v2"
	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/confmap"
	"github.com/knadh/koanf/providers/env/v2"
	"github.com/knadh/koanf/v2"
)

// envPrefix starts every Toron variable; only envServerPrefix and envLogPrefix variables
// are configuration keys (SPEC 1). Others, such as TORON_CONFIG, belong to main.
const (
	envPrefix       = "TORON_"
	envServerPrefix = envPrefix + "SERVER__"
	envLogPrefix    = envPrefix + "LOG__"
)

// Load reads the config file and the routes file and returns their configuration, with the
// configuration keys of environ (as from os.Environ) applied on top. A file that cannot be
// read, a missing one included, is an Error naming it. Every mistake is reported, joined
// with errors.Join; see LoadBytes.
func Load(configPath, routesPath string, environ []string) (*Config, error) {
	var errs errorList
	configYAML, err := os.ReadFile(configPath)
	if err != nil {
		errs = append(errs, &Error{File: configPath, Route: -1, Msg: "cannot read the config file", Err: pathCause(err)})
	}
	routesYAML, err := os.ReadFile(routesPath)
	if err != nil {
		errs = append(errs, &Error{File: routesPath, Route: -1, Msg: "cannot read the routes file", Err: pathCause(err)})
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return LoadBytes(configPath, configYAML, routesPath, routesYAML, environ)
}

// pathCause drops the *fs.PathError wrapper, whose text repeats the path the Error already
// names; errors.Is(err, fs.ErrNotExist) still holds on the cause.
func pathCause(err error) error {
	if pe, ok := errors.AsType[*fs.PathError](err); ok {
		return pe.Err
	}
	return err
}

// LoadBytes is Load from memory: configYAML holds the server and log keys (empty or nil means
// built-in defaults only, as in demo mode), routesYAML the route table. configName and
// routesName are used, as given, in error messages and as Config.ConfigFile/RoutesFile.
//
// The layers are built-in defaults < configYAML < environ. Every value is checked against
// its key's type in the layer it comes from, so an error names the file and key, or the
// environment variable, that the operator must fix. The returned Config has every default
// applied (MaxConnections and IdleTimeout included), route hosts lower-cased, route names
// filled in and each route's Effective resolved. On any error it is nil and the error joins
// every *Error found.
func LoadBytes(configName string, configYAML []byte, routesName string, routesYAML []byte, environ []string) (*Config, error) {
	l := &loader{configName: configName, routesName: routesName, origin: make(map[string]origin)}
	cfg := &Config{ConfigFile: configName, RoutesFile: routesName}

	k := koanf.New(".")
	layers := []koanf.Provider{
		confmap.Provider(defaultLayer(), "."),
		confmap.Provider(l.configLayer(configYAML), "."),
		env.Provider(".", env.Opt{
			Prefix:        envPrefix,
			EnvironFunc:   func() []string { return environ },
			TransformFunc: l.envKey,
		}),
	}
	for _, p := range layers {
		if err := k.Load(p, nil); err != nil {
			// Every layer is an in-memory map of checked values: koanf cannot fail here.
			return nil, fmt.Errorf("BUG: conf: merging configuration layers: %w", err)
		}
	}
	if err := unmarshalStrict(k, "server", &cfg.Server); err != nil {
		return nil, err
	}
	if err := unmarshalStrict(k, "log", &cfg.Log); err != nil {
		return nil, err
	}
	// Derived defaults: computed after the merge, so that they follow the worker_pool_size or
	// read_timeout the operator chose.
	if !k.Exists("server.max_connections") {
		cfg.Server.MaxConnections = DefaultMaxConnectionsPerWorker * cfg.Server.WorkerPoolSize
	}
	if !k.Exists("server.idle_timeout") {
		cfg.Server.IdleTimeout = cfg.Server.ReadTimeout
	}
	// Level and format names are case-insensitive, as LOG_LEVEL=DEBUG habits expect.
	cfg.Log.Level = strings.ToLower(cfg.Log.Level)
	cfg.Log.Format = strings.ToLower(cfg.Log.Format)
	l.checkServer(cfg)

	routes := l.routesLayer(routesYAML)
	for i := range routes {
		cfg.Routes = append(cfg.Routes, routes[i].Route)
	}
	cfg.resolve()
	l.checkRoutes(cfg, routes)

	if len(l.errs) > 0 {
		return nil, errors.Join(l.sorted()...)
	}
	cfg.Warnings = cfg.warnings()
	return cfg, nil
}

// unmarshalStrict decodes the section at path into out. The values were checked and
// converted layer by layer, so weak typing is off and an unused key is a bug.
func unmarshalStrict(k *koanf.Koanf, path string, out any) error {
	err := k.UnmarshalWithConf(path, out, koanf.UnmarshalConf{
		Tag:           "koanf",
		DecoderConfig: &mapstructure.DecoderConfig{ErrorUnused: true},
	})
	if err != nil {
		return fmt.Errorf("BUG: conf: decoding checked %s values: %w", path, err)
	}
	return nil
}

// origin is where a server or log value came from: the file and key, or the environment
// variable, that an error about the value must name.
type origin struct {
	file, key string
}

// loader holds the state of one LoadBytes call.
type loader struct {
	configName, routesName string
	// origin maps a koanf key ("server.port") to the layer that set its final value.
	origin map[string]origin
	errs   errorList
	// hasRedis: server.redis is set, so routes may have rate_limit.scope: global.
	hasRedis bool
}

// sorted returns the errors grouped as the operator reads them: config file, environment,
// routes file by route index, each group in the order found.
func (l *loader) sorted() []error {
	rank := func(err error) (int, int) {
		e, ok := errors.AsType[*Error](err)
		if !ok {
			return 3, 0
		}
		switch e.File {
		case l.configName:
			return 0, e.Route
		case EnvironmentSource:
			return 1, e.Route
		case l.routesName:
			return 2, e.Route
		}
		return 3, e.Route
	}
	out := slices.Clone(l.errs)
	slices.SortStableFunc(out, func(a, b error) int {
		fa, ra := rank(a)
		fb, rb := rank(b)
		return cmp.Or(cmp.Compare(fa, fb), cmp.Compare(ra, rb))
	})
	return out
}

// configErr records a mistake in the file or variable that set the koanf key key.
func (l *loader) configErr(key, format string, args ...any) {
	o, ok := l.origin[key]
	if !ok {
		if key == "server.max_connections" || key == "server.idle_timeout" {
			// A derived default (64 × worker_pool_size, read_timeout) is only wrong when the
			// key it derives from is, which is reported on that key.
			return
		}
		// Another built-in default: only wrong in combination with a key the operator set.
		o = origin{file: l.configName, key: key}
	}
	l.errs.add(o.file, -1, "", o.key, format, args...)
}

// configLayer parses the config file and returns its checked values as flat koanf keys.
// A value that fails its check is left out (the error is recorded), so the layer below
// stays in force and later checks do not report the same key twice.
func (l *loader) configLayer(b []byte) map[string]any {
	out := make(map[string]any)
	raw, err := yaml.Parser().Unmarshal(b)
	if err != nil {
		l.errs = append(l.errs, &Error{File: l.configName, Route: -1, Msg: "invalid YAML", Err: err})
		return out
	}
	sections := map[string]schema{"server": serverSchema, "log": logSchema}
	for _, top := range sortedKeys(raw) {
		sch, ok := sections[top]
		if !ok {
			msg := "unknown key (the config file has the keys server and log)"
			if top == "routes" {
				msg = "routes belong in the routes file" + orNamed(l.routesName)
			}
			l.errs.add(l.configName, -1, "", top, "%s", msg)
			continue
		}
		if raw[top] == nil {
			continue // "server:" with nothing under it: all defaults
		}
		section, ok := asMap(raw[top])
		if !ok {
			l.errs.add(l.configName, -1, "", top, "must be a mapping of keys, not %s", yamlLiteral(raw[top]))
			continue
		}
		for _, key := range sortedKeys(section) {
			full := top + "." + key
			kd, ok := sch[key]
			if !ok {
				l.errs.add(l.configName, -1, "", full, "%s", sch.unknownKey(key))
				continue
			}
			v, err := fromYAML(section[key], kd)
			if err != nil {
				l.errs.add(l.configName, -1, "", full, "%s", err)
				continue
			}
			out[full] = v
			l.origin[full] = origin{file: l.configName, key: full}
		}
	}
	return out
}

// orNamed appends " (name)" when name is set.
func orNamed(name string) string {
	if name == "" {
		return ""
	}
	return " (" + name + ")"
}

// envKey is the env provider's TransformFunc: it maps TORON_SERVER__READ_TIMEOUT to
// server.read_timeout with its value converted to the key's type, and drops every other
// variable. A mistake is recorded and the variable dropped, so that it cannot replace a
// valid value from a lower layer.
func (l *loader) envKey(name, value string) (string, any) {
	var section string
	var sch schema
	switch {
	case strings.HasPrefix(name, envServerPrefix):
		section, sch = "server", serverSchema
	case strings.HasPrefix(name, envLogPrefix):
		section, sch = "log", logSchema
	default:
		// TORON_CONFIG, TORON_ROUTES and anything else of main's: not configuration keys.
		return "", nil
	}
	prefix := envPrefix + strings.ToUpper(section) + "__"
	key := strings.ToLower(strings.TrimPrefix(name, prefix))
	section, sch, key = nestedEnvKey(section, sch, key)
	prefix = envPrefix + strings.ToUpper(strings.ReplaceAll(section, ".", "__")) + "__"
	kd, ok := sch[key]
	if !ok {
		msg := fmt.Sprintf("%s.%s is not a configuration key", section, key)
		if best := sch.suggest(key); best != "" {
			msg += fmt.Sprintf(" (did you mean %s%s?)", prefix, strings.ToUpper(best))
		}
		l.errs.add(EnvironmentSource, -1, "", name, "%s", msg)
		return "", nil
	}
	v, err := fromEnv(value, kd)
	if err != nil {
		l.errs.add(EnvironmentSource, -1, "", name, "%s", err)
		return "", nil
	}
	full := section + "." + key
	l.origin[full] = origin{file: EnvironmentSource, key: name}
	return full, v
}

// routeInput is one decoded entry of routes.yaml with what validation needs to know
// beyond the Route itself.
type routeInput struct {
	Route
	// present holds the keys the entry set, to tell "missing" from "empty".
	present map[string]bool
	// rawPrefix is the prefix as written, for error messages ("" when not a string).
	rawPrefix string
	// failed holds the keys whose value failed its type check: already reported, so the
	// value checks skip them rather than report "is required" as well.
	failed map[string]bool
	// mapping is false when the entry is not a YAML mapping: it has no keys to check.
	mapping bool
}

// routesLayer parses the routes file into checked entries. Entries keep their index in the
// file even when an earlier one is broken, so that errors name the right routes[i].
func (l *loader) routesLayer(b []byte) []routeInput {
	raw, err := yaml.Parser().Unmarshal(b)
	if err != nil {
		l.errs = append(l.errs, &Error{File: l.routesName, Route: -1, Msg: "invalid YAML", Err: err})
		return nil
	}
	for _, top := range sortedKeys(raw) {
		if top == "routes" {
			continue
		}
		msg := "unknown key (the routes file has one key, routes)"
		if _, ok := serverSchema[top]; ok || top == "server" || top == "log" {
			msg = "server and log settings belong in the config file" + orNamed(l.configName)
		}
		l.errs.add(l.routesName, -1, "", top, "%s", msg)
	}
	list, present := raw["routes"]
	if !present {
		// An empty file is most likely the wrong file: make the operator say "routes: []".
		l.errs.add(l.routesName, -1, "", "routes", "is required (write routes: [] for a gateway that only answers %s and %s)", DefaultHealthPath, DefaultMetricsPath)
		return nil
	}
	if list == nil {
		return nil
	}
	items, ok := list.([]any)
	if !ok {
		l.errs.add(l.routesName, -1, "", "routes", "must be a list of routes, not %s", yamlLiteral(list))
		return nil
	}
	out := make([]routeInput, 0, len(items))
	for i, item := range items {
		out = append(out, l.decodeRoute(i, item))
	}
	return out
}

// decodeRoute checks the keys and value types of one route entry and decodes it.
func (l *loader) decodeRoute(i int, item any) routeInput {
	in := routeInput{present: make(map[string]bool), failed: make(map[string]bool)}
	m, ok := asMap(item)
	if !ok {
		l.errs.add(l.routesName, i, "", "", "must be a mapping with at least type, prefix and target, not %s", yamlLiteral(item))
		return in
	}
	in.mapping = true
	if p, ok := m["prefix"].(string); ok {
		in.rawPrefix = p
	}
	typed := make(map[string]any, len(m))
	for _, key := range sortedKeys(m) {
		if l.decodeUpstreamKey(i, &in, key, m[key]) || l.decodeTrafficKey(i, &in, key, m[key]) {
			continue
		}
		kd, ok := routeSchema[key]
		if !ok {
			l.errs.add(l.routesName, i, in.rawPrefix, key, "%s", routeSchema.unknownKey(key))
			continue
		}
		v, err := fromYAML(m[key], kd)
		if err != nil {
			l.errs.add(l.routesName, i, in.rawPrefix, key, "%s", err)
			in.failed[key] = true
			continue
		}
		typed[key] = v
		in.present[key] = true
	}
	dec, err := mapstructure.NewDecoder(&mapstructure.DecoderConfig{
		TagName:     "koanf",
		ErrorUnused: true,
		Result:      &in.Route,
	})
	if err == nil {
		err = dec.Decode(typed)
	}
	if err != nil {
		// Values were converted to the fields' types above, so this is a bug; it is reported
		// rather than panicked so that a reload cannot take the serving gateway down.
		l.errs.add(l.routesName, i, in.rawPrefix, "", "BUG: conf: decoding checked route values: %v", err)
	}
	return in
}

// asMap returns a YAML mapping as map[string]any. YAML decodes a mapping with a non-string
// key (1: x) as map[any]any: its keys are stringified, so they are reported as unknown.
func asMap(v any) (map[string]any, bool) {
	switch m := v.(type) {
	case map[string]any:
		return m, true
	case map[any]any:
		out := make(map[string]any, len(m))
		for k, v := range m {
			out[fmt.Sprint(k)] = v
		}
		return out, true
	}
	return nil, false
}

// sortedKeys returns the keys of m in order, so errors come out the same on every run.
func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
