package routerfaults

import (
	"encoding/json"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/test/routerfaults/world"
)

// Client addresses on loopback, each a namespace's pods in the worlds that
// list them (world.File.Clients).
const (
	ClientA = "127.0.0.2"
	ClientB = "127.0.0.3"
)

// NewModel is a routed vLLM model namespace/name serving served, reached by
// the host name.namespace, on the replicas.
func NewModel(namespace, name, served string, eps ...world.Endpoint) world.Model {
	obj := servingv1.AIInference{
		TypeMeta:   metav1.TypeMeta{APIVersion: servingv1.GroupVersion.String(), Kind: "AIInference"},
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
	}
	obj.Spec.Model.Name = served
	obj.Spec.Engine.Type = servingv1.EngineVLLM
	obj.Spec.Routing = &servingv1.RoutingSpec{Enabled: true}
	return world.Model{Object: obj, Hosts: []string{name + "." + namespace}, Endpoints: eps}
}

// HostOf is the Host header that leads to the model.
func HostOf(m world.Model) string { return m.Hosts[0] }

// EmptyMessagesBody is a chat body of size bytes (or one or two less)
// whose messages are all {}: the cheapest bytes a client can send for the
// most a JSON decoder builds.
func EmptyMessagesBody(model string, size int) []byte {
	head, _ := json.Marshal(model)
	prefix := `{"model":` + string(head) + `,"messages":[`
	const suffix = `{}]}`
	n := (size - len(prefix) - len(suffix)) / 3
	var b strings.Builder
	b.Grow(size)
	b.WriteString(prefix)
	for range n {
		b.WriteString("{},")
	}
	b.WriteString(suffix)
	return []byte(b.String())
}

// LongChatBody is an ordinary chat of about size bytes: a system prompt and
// turns of 4 KiB of words, as a long conversation resends its history.
func LongChatBody(model string, size int) []byte {
	type message struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	turn := strings.Repeat("the replica keeps the prefix of the prompt in its cache ", 75)
	messages := []message{{Role: "system", Content: turn}}
	for total := len(turn); total+len(turn)+64 < size; total += len(turn) + 40 {
		role := "user"
		if len(messages)%2 == 0 {
			role = "assistant"
		}
		messages = append(messages, message{Role: role, Content: turn})
	}
	body, _ := json.Marshal(map[string]any{"model": model, "messages": messages, "max_tokens": 16})
	return body
}
