package conf

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"time"
)

// CheckJSON returns the effective configuration as indented JSON, what toron -check prints:
// the server and log settings with every default applied, the elevated budget, and for each
// route its effective values, whether it is elevated and why, and its max_concurrency with
// where that value came from. Durations are Go duration strings ("5s"), not nanoseconds.
func (c *Config) CheckJSON() ([]byte, error) {
	view := struct {
		ConfigFile     string   `json:"config_file"`
		RoutesFile     string   `json:"routes_file"`
		Server         Server   `json:"server"`
		ElevatedBudget int      `json:"elevated_budget"`
		Log            Log      `json:"log"`
		Routes         []Route  `json:"routes"`
		Warnings       []string `json:"warnings,omitempty"`
	}{c.ConfigFile, c.RoutesFile, c.Server, c.ElevatedBudget(), c.Log, c.Routes, c.Warnings}
	if view.Routes == nil {
		view.Routes = []Route{} // "routes": [] reads better than null
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // the reasons say "10s > server 5s", not "\u003e"
	enc.SetIndent("", "  ")
	if err := enc.Encode(view); err != nil {
		return nil, fmt.Errorf("cannot encode the effective configuration as JSON: %w", err)
	}
	return buf.Bytes(), nil
}

// MarshalJSON encodes the server settings with durations as Go duration strings, so that
// -check and logs show "5s" where the operator wrote 5s.
func (s Server) MarshalJSON() ([]byte, error) { return marshalWithDurations(reflect.ValueOf(s)) }

// MarshalJSON encodes a route's effective settings with durations as Go duration strings.
func (e Effective) MarshalJSON() ([]byte, error) { return marshalWithDurations(reflect.ValueOf(e)) }

// durationType is the type written as a string by marshalWithDurations.
var durationType = reflect.TypeFor[time.Duration]()

// marshalWithDurations encodes struct v like encoding/json does (json tags, omitempty, field
// order), except that time.Duration fields become strings. It walks the fields itself rather
// than mirroring each struct in a second one, so a field added later is encoded too.
func marshalWithDurations(v reflect.Value) ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteByte('{')
	first := true
	for i := range v.NumField() {
		f := v.Type().Field(i)
		if !f.IsExported() {
			continue
		}
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		fv := v.Field(i)
		if strings.Contains(opts, "omitempty") && isEmpty(fv) {
			continue
		}
		var val any = fv.Interface()
		if f.Type == durationType {
			val = formatDuration(time.Duration(fv.Int()))
		}
		if !first {
			buf.WriteByte(',')
		}
		first = false
		if err := encodeValue(&buf, name); err != nil {
			return nil, err
		}
		buf.WriteByte(':')
		if err := encodeValue(&buf, val); err != nil {
			return nil, fmt.Errorf("field %s: %w", f.Name, err)
		}
	}
	buf.WriteByte('}')
	return buf.Bytes(), nil
}

// encodeValue appends v as compact JSON without HTML escaping, so that an elevated reason
// reads "10s > server 5s" in -check output.
func encodeValue(buf *bytes.Buffer, v any) error {
	enc := json.NewEncoder(buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return err
	}
	buf.Truncate(buf.Len() - 1) // Encode ends with a newline
	return nil
}

// formatDuration is time.Duration.String without the trailing zero units ("1m" rather than
// "1m0s", "2h" rather than "2h0m0s"); the result still parses with time.ParseDuration.
func formatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// isEmpty is encoding/json's omitempty test.
func isEmpty(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.Array, reflect.Map, reflect.Slice, reflect.String:
		return v.Len() == 0
	}
	return v.IsZero()
}

var (
	_ json.Marshaler = Server{}
	_ json.Marshaler = Effective{}
)
