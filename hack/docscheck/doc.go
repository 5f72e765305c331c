// Package docscheck holds a test that keeps README.md and docs/*.md true to
// the code: every flag they name for the operator (manager), the model loader
// (model-loader, model-loader warmup) or the kubectl plugin (kubectl aii)
// exists, and every PascalCase word they write as code (a reason, a condition,
// a phase, a test, an alert) exists in the code or the manifests.
package docscheck
