package conf

import "errors"

// ReloadCompatible reports whether c may replace old on a reload (SIGHUP). The listener
// address, max_connections, max_header_bytes and worker_pool_size are fixed for the life of
// the process, since the listener and the fasthttp server are built once from them (SPEC 2):
// a change is an Error naming each key, and the old configuration keeps serving.
func (c *Config) ReloadCompatible(old *Config) error {
	var errs errorList
	check := func(key string, was, now any) {
		if was != now {
			errs.add(c.ConfigFile, -1, "", "server."+key, "cannot change on reload (%v -> %v): restart the gateway to apply it", was, now)
		}
	}
	check("host", old.Server.Host, c.Server.Host)
	check("port", old.Server.Port, c.Server.Port)
	check("max_connections", old.Server.MaxConnections, c.Server.MaxConnections)
	check("max_header_bytes", old.Server.MaxHeaderBytes, c.Server.MaxHeaderBytes)
	check("worker_pool_size", old.Server.WorkerPoolSize, c.Server.WorkerPoolSize)
	checkProxyProtocolReload(old, c, &errs)
	check("tls", presence(old.Server.TLS), presence(c.Server.TLS)) // the listener is built once
	check("tls.http_redirect.port", redirectPort(old), redirectPort(c))
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	return nil
}

// presence names whether an optional section is configured, for reload errors.
func presence[T any](p *T) string {
	if p == nil {
		return "absent"
	}
	return "present"
}
