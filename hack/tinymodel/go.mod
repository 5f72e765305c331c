module github.com/aiinference/operator/hack/tinymodel

go 1.26.8

require (
	github.com/ollama/ollama v0.9.6
	github.com/x448/float16 v0.8.4
)

require golang.org/x/sync v0.12.0 // indirect
