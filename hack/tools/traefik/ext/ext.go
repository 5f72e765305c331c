// Package ext stands in for Traefik's dynamic configuration extension point.
//
// Traefik's go.mod replaces github.com/traefik/traefik/dynamic/ext with a
// folder of its repository (./pkg/config/dynamic/ext), a nested module that
// its module download leaves out and that no proxy serves. A replace in a
// dependency's go.mod does not apply to the module that builds it, so this
// tools module points the same path here. Traefik embeds both types inline
// in its dynamic configuration (dynamic.HTTPConfiguration and dynamic.Router)
// to let other builds add fields; the open-source build adds none, so both
// are empty, and the Traefik built here reads the configuration it always
// does.
package ext

// HTTP is embedded in Traefik's dynamic HTTP configuration.
type HTTP struct{}

// Router is embedded in Traefik's dynamic router.
type Router struct{}
