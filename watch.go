package main

import (
	"fmt"

	"go.uber.org/zap"

	"toron/conf"
	"toron/gateway"
)

// watchEnv turns -watch on from the environment (SPEC 1).
const watchEnv = "TORON_WATCH"

// envWatch reads TORON_WATCH: true or 1 turns -watch on; false, 0 or unset leaves it off;
// anything else is a mistake, not silently off.
func envWatch(environ []string) (bool, error) {
	switch v := envOr(environ, watchEnv, ""); v {
	case "true", "1":
		return true, nil
	case "false", "0", "":
		return false, nil
	default:
		return false, fmt.Errorf("%s=%q: want true or 1 (or false, 0)", watchEnv, v)
	}
}

// watchedFiles are the files whose change -watch turns into a reload: the config and routes
// files, the certificate, users and JWKS files cfg names, and the files the config and routes files on disk
// name, refused or not (SPEC 18: a certificate that arrives after the configuration naming it
// is picked up without another edit).
func watchedFiles(o options, cfg *conf.Config) []string {
	files := []string{o.config, o.routes}
	// The certificate files of cfg: server.tls's pairs and client CA, the routes' tls_ca_file
	// (SPEC 14: they are re-read on every reload, so a change to one is a reason to reload).
	files = append(files, cfg.TLSFiles()...)
	// The users files and JWKS files of its auth blocks (SPEC 19): the reload re-reads them.
	files = append(files, cfg.AuthFiles()...)
	return append(files, conf.NamedFiles(o.config, o.routes)...)
}

// startWatch starts the -watch watcher of SPEC 18 on the files of cfg; its errors are logged
// and the watch goes on. In demo mode there is no file to watch: nil, with a warning.
func startWatch(o options, cfg *conf.Config, log *zap.Logger) (*conf.Watcher, error) {
	if o.demo {
		log.Warn("-watch has no files to watch in demo mode")
		return nil, nil
	}
	w, err := conf.NewWatcher(watchedFiles(o, cfg), func(err error) {
		log.Error("configuration watch", zap.Error(err))
	})
	if err != nil {
		return nil, err
	}
	log.Info("watching the configuration files", zap.Strings("files", watchedFiles(o, cfg)))
	return w, nil
}

// reloadOnChange is main's answer to changed files reported by the watcher: SIGHUP's reload
// (same validation, logs and metrics), then the files of the configuration now in force, whose
// certificate paths may have changed.
func reloadOnChange(files []string, w *conf.Watcher, o options, g *gateway.Gateway, load func() (*conf.Config, error), log *zap.Logger, level zap.AtomicLevel, format string) {
	log.Info("configuration files changed", zap.Strings("files", files))
	reload(g, load, log, level, format)
	w.SetPaths(watchedFiles(o, g.Config()))
}
