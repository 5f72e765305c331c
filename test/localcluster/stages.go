package localcluster

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
)

// kwok plays the kubelets by Stages (kwok.x-k8s.io/v1alpha1): each matches
// objects by jq expressions, waits a delay, then patches the object's status
// from a Go template (with sprig's functions and kwok's Now and Quote). The
// cluster runs kwok's own node stages as they are, kwok's pod/general stages
// with their delays scaled, and stages of its own that make a labelled pod's
// container fail and restart in place as a kubelet does (chaos.go).

// nodeStageSets are kwok's node stages, relative to its kustomize/stage folder:
// nodes become Ready at once and keep a lease.
var nodeStageSets = []string{"node/fast", "node/heartbeat-with-lease"}

// podStageSet takes pods through their init containers to Ready and removes
// them once deleted, each step after 1-5 s.
const podStageSet = "pod/general"

// replacedPodStages are kwok's pod stages that must leave the pods of a failure
// behaviour alone, by the behaviour's label: its own stages take their place.
var replacedPodStages = map[string]string{
	"pod-init-container-running":   InitContainerFailureLabel,
	"pod-init-container-completed": InitContainerFailureLabel,
	"pod-ready":                    ContainerCrashLoopLabel,
}

// WriteStageConfig writes the Stages kwok runs into one multi-document YAML
// file at path, for kwok's --config: kwok's node stages and pod/general stages
// from stageDir (kwok's kustomize/stage folder), the latter with every delay
// multiplied by delayScale (0: 1), then the stages of the failure behaviours.
func WriteStageConfig(stageDir, path string, delayScale float64) error {
	if err := checkDelayScale(delayScale); err != nil {
		return err
	}
	if delayScale == 0 {
		delayScale = 1
	}
	var out bytes.Buffer
	for _, set := range nodeStageSets {
		files, err := kustomizationResources(stageDir, set)
		if err != nil {
			return err
		}
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				return err
			}
			fmt.Fprintf(&out, "---\n# %s\n%s\n", f, bytes.TrimSpace(data))
		}
	}

	files, err := kustomizationResources(stageDir, podStageSet)
	if err != nil {
		return err
	}
	podStages := map[string]*kwokStage{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		s := &kwokStage{}
		// Strict: a field this package does not know would be lost on the way out.
		if err := yaml.UnmarshalStrict(data, s); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		s.Spec.Delay.scale(delayScale)
		if err := keepSidecarsRunning(s); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		s.Spec.Selector.MatchExpressions = append(s.Spec.Selector.MatchExpressions, configGates[s.Metadata.Name]...)
		if label, ok := replacedPodStages[s.Metadata.Name]; ok {
			s.Spec.Selector.MatchExpressions = append(s.Spec.Selector.MatchExpressions,
				matchExpression{Key: labelKey(label), Operator: "NotIn", Values: []string{"true"}})
		}
		podStages[s.Metadata.Name] = s
		if err := writeStage(&out, fmt.Sprintf("%s, delays x%g", f, delayScale), s); err != nil {
			return err
		}
	}
	for name := range configGates {
		if podStages[name] == nil {
			return fmt.Errorf("kwok's %s has no stage %s", podStageSet, name)
		}
	}
	if err := writeStage(&out, "configuration error (configcheck.go)", configErrorStage()); err != nil {
		return err
	}
	for name := range replacedPodStages {
		if podStages[name] == nil {
			return fmt.Errorf("kwok's %s has no stage %s", podStageSet, name)
		}
	}

	timing := newFailureTiming(delayScale)
	for _, s := range initContainerFailureStages(timing, podStages["pod-init-container-running"].Spec.Delay) {
		if err := writeStage(&out, "init container failure", s); err != nil {
			return err
		}
	}
	for _, s := range containerCrashLoopStages(timing, podStages["pod-ready"].Spec.Delay) {
		if err := writeStage(&out, "container crash loop", s); err != nil {
			return err
		}
	}
	return os.WriteFile(path, out.Bytes(), 0o644)
}

// configGates hold kwok's stages that start containers until the cluster has
// checked the pod's Secrets and ConfigMaps (configcheck.go): init containers
// run unless one of them has a configuration error, the containers unless any
// has.
var configGates = map[string][]matchExpression{
	"pod-init-container-running": {
		{Key: annotationKey(ConfigCheckedAnnotation), Operator: "In", Values: []string{"true"}},
		{Key: fmt.Sprintf(`(.metadata.annotations[%q] // "") as $name | any(.spec.initContainers[]?; .name == $name)`, ConfigErrorContainerAnnotation),
			Operator: "In", Values: []string{"false"}},
	},
	"pod-ready": {
		{Key: annotationKey(ConfigCheckedAnnotation), Operator: "In", Values: []string{"true"}},
		{Key: annotationKey(ConfigErrorAnnotation), Operator: "DoesNotExist"},
	},
}

func annotationKey(annotation string) string {
	return fmt.Sprintf(".metadata.annotations[%q]", annotation)
}

// configErrorStage shows a pod's configuration error as a kubelet does: the
// container waits with CreateContainerConfigError and the error as message;
// an init container's predecessors have completed. When the error is gone
// (the annotation removed), kwok's own stages start the containers.
func configErrorStage() *kwokStage {
	s := &kwokStage{APIVersion: "kwok.x-k8s.io/v1alpha1", Kind: "Stage"}
	s.Metadata.Name = "config-error"
	s.Spec.ResourceRef.APIGroup = "v1"
	s.Spec.ResourceRef.Kind = "Pod"
	// Shown already: the container waits with this very error (a kubelet
	// shows the new message when the error changes, a missing key after a
	// missing Secret).
	shown := fmt.Sprintf(`(.metadata.annotations[%q]) as $name | (.metadata.annotations[%q]) as $message | [(.status.initContainerStatuses[]?, .status.containerStatuses[]?) | select(.name == $name) | (.state.waiting.reason == "CreateContainerConfigError" and .state.waiting.message == $message)][0] // false`,
		ConfigErrorContainerAnnotation, ConfigErrorAnnotation)
	s.Spec.Selector.MatchExpressions = []matchExpression{
		{Key: ".metadata.deletionTimestamp", Operator: "DoesNotExist"},
		{Key: ".status.phase", Operator: "In", Values: []string{"Pending"}},
		{Key: ".status.podIP", Operator: "Exists"}, // kwok's pod-create has set the statuses
		{Key: annotationKey(ConfigErrorAnnotation), Operator: "Exists"},
		{Key: shown, Operator: "NotIn", Values: []string{"true"}},
	}
	s.Spec.Next.StatusTemplate = fmt.Sprintf(`{{- $now := Now }}
{{- $name := index .metadata.annotations %q }}
{{- $message := index .metadata.annotations %q }}
{{- $before := true }}
{{- if .status.initContainerStatuses }}
initContainerStatuses:
{{- range $status := .status.initContainerStatuses }}
{{- if eq $status.name $name }}
{{- $before = false }}
- name: {{ $status.name | Quote }}
  image: {{ $status.image | Quote }}
  ready: false
  started: false
  restartCount: {{ $status.restartCount }}
  state:
    waiting:
      reason: CreateContainerConfigError
      message: {{ $message | Quote }}
{{- else if and $before (not $status.state.terminated) }}
- name: {{ $status.name | Quote }}
  image: {{ $status.image | Quote }}
  ready: true
  started: false
  restartCount: {{ $status.restartCount }}
  state:
    terminated:
      exitCode: 0
      reason: Completed
      startedAt: {{ $now | Quote }}
      finishedAt: {{ $now | Quote }}
{{- else }}
- {{ toJson $status }}
{{- end }}
{{- end }}
{{- end }}
{{- if .status.containerStatuses }}
containerStatuses:
{{- range $status := .status.containerStatuses }}
{{- if eq $status.name $name }}
- name: {{ $status.name | Quote }}
  image: {{ $status.image | Quote }}
  ready: false
  started: false
  restartCount: {{ $status.restartCount }}
  state:
    waiting:
      reason: CreateContainerConfigError
      message: {{ $message | Quote }}
{{- else }}
- {{ toJson $status }}
{{- end }}
{{- end }}
{{- end }}
`, ConfigErrorContainerAnnotation, ConfigErrorAnnotation)
	return s
}

// kwok's pod-init-container-completed ends every init container with exit 0,
// sidecars (restartPolicy Always) too, which a kubelet keeps running for the
// pod's life: the operator's warm-up gate is one. sidecarStages makes the stage
// end only the others and start sidecars, not ready until the pod's containers
// are (pod-ready: a sidecar's readiness probe, such as the warm-up gate's, waits
// on the main containers). The stage also stops firing once the pod is
// Initialized: its selector (an init container running) would otherwise keep
// matching a pod whose sidecar runs, and race pod-ready for it.
var sidecarStages = map[string]struct{ replace, with string }{
	"pod-init-container-completed": {
		replace: `  ready: true
  restartCount: 0
  started: false
  state:
    terminated:
      exitCode: 0
      finishedAt: {{ $now | Quote }}
      reason: Completed
      startedAt: {{ $now | Quote }}
`,
		with: `  restartCount: 0
{{ if eq (printf "%v" $item.restartPolicy) "Always" }}
  ready: false
  started: true
  state:
    running:
      startedAt: {{ $now | Quote }}
{{ else }}
  ready: true
  started: false
  state:
    terminated:
      exitCode: 0
      finishedAt: {{ $now | Quote }}
      reason: Completed
      startedAt: {{ $now | Quote }}
{{ end }}
`,
	},
	"pod-ready": {
		replace: "phase: Running\n",
		with: `phase: Running
initContainerStatuses:
{{ range $root.status.initContainerStatuses }}
- {{ if .state.running }}{{ merge (dict "ready" true) . | toJson }}{{ else }}{{ . | toJson }}{{ end }}
{{ end }}
`,
	},
}

// keepSidecarsRunning rewrites kwok's stage s as sidecarStages says, if it is
// one of them.
func keepSidecarsRunning(s *kwokStage) error {
	edit, ok := sidecarStages[s.Metadata.Name]
	if !ok {
		return nil
	}
	if !strings.Contains(s.Spec.Next.StatusTemplate, edit.replace) {
		return fmt.Errorf("stage %s: its status template no longer has the part that simulates sidecars; see sidecarStages", s.Metadata.Name)
	}
	s.Spec.Next.StatusTemplate = strings.Replace(s.Spec.Next.StatusTemplate, edit.replace, edit.with, 1)
	if s.Metadata.Name == "pod-init-container-completed" {
		s.Spec.Selector.MatchExpressions = append(s.Spec.Selector.MatchExpressions, matchExpression{
			Key: `.status.conditions.[] | select( .type == "Initialized" ) | .status`, Operator: "NotIn", Values: []string{"True"}})
	}
	return nil
}

// checkDelayScale accepts a kubelet delay scale: a positive number, or 0 for 1.
func checkDelayScale(scale float64) error {
	if scale < 0 || math.IsNaN(scale) || math.IsInf(scale, 0) {
		return fmt.Errorf("kubelet delay scale %g: must be a positive number", scale)
	}
	return nil
}

// kustomizationResources lists the files of a kwok stage set.
func kustomizationResources(stageDir, set string) ([]string, error) {
	data, err := os.ReadFile(filepath.Join(stageDir, set, "kustomization.yaml"))
	if err != nil {
		return nil, err
	}
	var kustomization struct {
		Resources []string `json:"resources"`
	}
	if err := yaml.Unmarshal(data, &kustomization); err != nil {
		return nil, fmt.Errorf("%s/kustomization.yaml: %w", set, err)
	}
	var files []string
	for _, r := range kustomization.Resources {
		files = append(files, filepath.Join(stageDir, set, r))
	}
	return files, nil
}

func writeStage(out *bytes.Buffer, origin string, s *kwokStage) error {
	data, err := yaml.Marshal(s)
	if err != nil {
		return fmt.Errorf("stage %s: %w", s.Metadata.Name, err)
	}
	fmt.Fprintf(out, "---\n# %s\n%s", origin, data)
	return nil
}

// kwokStage is kwok's Stage as far as its pod/general stages and ours use it,
// in the forms kwok's own stage files use (v0.8 still reads them).
type kwokStage struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec stageSpec `json:"spec"`
}

type stageSpec struct {
	ResourceRef struct {
		APIGroup string `json:"apiGroup"`
		Kind     string `json:"kind"`
	} `json:"resourceRef"`
	Selector   stageSelector   `json:"selector"`
	Weight     int             `json:"weight,omitempty"`
	WeightFrom *expressionFrom `json:"weightFrom,omitempty"`
	Delay      *stageDelay     `json:"delay,omitempty"`
	Next       stageNext       `json:"next"`
}

type stageSelector struct {
	MatchExpressions []matchExpression `json:"matchExpressions"`
}

// matchExpression holds when the jq expression Key yields one of Values (In,
// NotIn) or anything non-null (Exists, DoesNotExist). kwok compares strings,
// booleans ("true") and integers only.
type matchExpression struct {
	Key      string   `json:"key"`
	Operator string   `json:"operator"`
	Values   []string `json:"values,omitempty"`
}

// expressionFrom is a jq expression. For a delay it yields a Go duration
// ("1.5s") or a point in time (RFC 3339) to wait for; nothing: the fixed delay.
type expressionFrom struct {
	ExpressionFrom string `json:"expressionFrom"`
}

// stageDelay is DurationMilliseconds plus a random part up to
// JitterDurationMilliseconds (when that is larger); the From expressions
// replace the numbers when they yield a value.
type stageDelay struct {
	DurationMilliseconds       *int64          `json:"durationMilliseconds,omitempty"`
	DurationFrom               *expressionFrom `json:"durationFrom,omitempty"`
	JitterDurationMilliseconds *int64          `json:"jitterDurationMilliseconds,omitempty"`
	JitterDurationFrom         *expressionFrom `json:"jitterDurationFrom,omitempty"`
}

type stageNext struct {
	Event          *stageEvent `json:"event,omitempty"`
	Delete         bool        `json:"delete,omitempty"`
	StatusTemplate string      `json:"statusTemplate,omitempty"`
}

type stageEvent struct {
	Type    string `json:"type"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// scale multiplies the delay by factor. Expressions that read an annotation
// are a pod's own choice and stay. Any other expression is a point in time of
// the object (in kwok's pod/general: the deletion timestamp, so that a pod goes
// within its grace period); its distance from now is scaled.
func (d *stageDelay) scale(factor float64) {
	if d == nil {
		return
	}
	for _, ms := range []*int64{d.DurationMilliseconds, d.JitterDurationMilliseconds} {
		if ms != nil {
			*ms = int64(math.Round(float64(*ms) * factor))
		}
	}
	for _, e := range []*expressionFrom{d.DurationFrom, d.JitterDurationFrom} {
		if e != nil && !strings.HasPrefix(e.ExpressionFrom, ".metadata.annotations[") {
			e.ExpressionFrom = fmt.Sprintf("%s%s | fromdateiso8601 | untilNow((. - now) * %g + now)", jqUntil, e.ExpressionFrom, factor)
		}
	}
}

// jqUntil defines untilNow($t): the Go duration from now until the Unix time
// $t, in whole milliseconds, at least 0. A delay as a duration is exact where
// a point in time in RFC 3339 would be rounded down to the second.
const jqUntil = `def untilNow($t): (([$t - now, 0] | max) * 1000 | floor | tostring) + "ms"; `

// jqLatest defines latest: the Unix time at the end of the second an API time
// (RFC 3339, kept to the second) names. A delay counted from it is never
// shorter than asked, and at most a second longer.
const jqLatest = `def latest: fromdateiso8601 + 1; `

// jqSeconds defines seconds: a Go duration string ("1m30s", "1.5s", "500ms")
// in seconds; null for the empty string.
const jqSeconds = `def seconds: [scan("([0-9.]+)(ns|us|µs|ms|s|m|h)") | (.[0] | tonumber) * ` +
	`{"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 0.001, "s": 1, "m": 60, "h": 3600}[.[1]]] | add; `

// failureTiming is how long the steps of a failure behaviour take.
type failureTiming struct {
	// defaultRunFor is how long a container runs before it exits, unless the pod says.
	defaultRunFor time.Duration
	// exitShown is how long the exit shows before the back-off: the kubelet
	// notices the exit and tries a restart within about a second.
	exitShown time.Duration
	// backOff is the kubelet's crash-loop back-off after the exit of run 0, 1, 2...:
	// 10 s doubling up to 5 min; the last entry holds for every later run.
	backOff []time.Duration
}

func newFailureTiming(delayScale float64) failureTiming {
	scaled := func(d time.Duration) time.Duration { return time.Duration(float64(d) * delayScale) }
	t := failureTiming{defaultRunFor: scaled(time.Second), exitShown: scaled(time.Second)}
	maxBackOff := scaled(5 * time.Minute)
	for d := scaled(10 * time.Second); d > 0 && d < maxBackOff; d *= 2 {
		t.backOff = append(t.backOff, d)
	}
	t.backOff = append(t.backOff, maxBackOff)
	return t
}

// failureStages are the kwok Stages of one failure behaviour.
type failureStages struct {
	name string // prefix of the stage names
	keys failureKeys
	// specField and statusField are the pod's list of such containers and of their statuses.
	specField, statusField string
	// phase is the pod's phase all along the crash loop.
	phase  string
	timing failureTiming
}

// initContainerFailureStages: kwok's pod-create makes the init containers
// wait (PodInitializing); then the ones before the failing container complete
// and it runs (after startDelay, as kwok's pod-init-container-running would),
// and it goes round the crash loop. The pod stays Pending, its containers wait.
func initContainerFailureStages(timing failureTiming, startDelay *stageDelay) []*kwokStage {
	f := failureStages{name: "init-container-failure", keys: initContainerFailureKeys,
		specField: "initContainers", statusField: "initContainerStatuses", phase: "Pending", timing: timing}
	start := f.stage("start", "Pending", []matchExpression{
		{Key: f.jqFailingStatus() + " | .state.waiting.reason", Operator: "In", Values: []string{"PodInitializing"}},
	}, startDelay, f.initContainersStartTemplate())
	return append([]*kwokStage{start}, f.crashLoop()...)
}

// containerCrashLoopStages: once the init containers are done (kwok's
// pod-init-container-completed), the containers start (after startDelay, as
// kwok's pod-ready would), but the crashing one never becomes ready; it goes
// round the crash loop. The pod is Running and not Ready.
func containerCrashLoopStages(timing failureTiming, startDelay *stageDelay) []*kwokStage {
	f := failureStages{name: "container-crash-loop", keys: containerCrashLoopKeys,
		specField: "containers", statusField: "containerStatuses", phase: "Running", timing: timing}
	start := f.stage("start", "Pending", []matchExpression{
		{Key: `.status.conditions[]? | select(.type == "Initialized") | .status`, Operator: "In", Values: []string{"True"}},
		{Key: ".status.containerStatuses[]?.state.running.startedAt", Operator: "DoesNotExist"},
	}, startDelay, f.containersStartTemplate())
	return append([]*kwokStage{start}, f.crashLoop()...)
}

// crashLoop: the running container exits with the chosen code after its run
// time; the exit shows briefly (kubectl: Error, Init:Error), then the container
// waits in CrashLoopBackOff with the exit as its last state; after the back-off
// (from the exit) it runs again with restartCount one higher; and so on.
func (f failureStages) crashLoop() []*kwokStage {
	exit := f.stage("exit", f.phase, []matchExpression{
		{Key: f.jqFailingStatus() + " | .state.running.startedAt", Operator: "Exists"},
	}, &stageDelay{DurationFrom: &expressionFrom{ExpressionFrom: fmt.Sprintf(
		`%s%s%s. as $pod | ((($pod.metadata.annotations[%q] // "") | seconds) // %g) as $runFor | %s | untilNow((.state.running.startedAt | latest) + $runFor)`,
		jqUntil, jqLatest, jqSeconds, f.keys.runFor, f.timing.defaultRunFor.Seconds(), f.jqFailingStatus())}},
		f.exitTemplate())

	backOff := f.stage("back-off", f.phase, []matchExpression{
		{Key: f.jqFailingStatus() + " | (.state.terminated.exitCode // 0) != 0", Operator: "In", Values: []string{"true"}},
	}, &stageDelay{DurationMilliseconds: ptr.To(f.timing.exitShown.Milliseconds())}, f.backOffTemplate())
	backOff.Spec.Next.Event = &stageEvent{Type: "Warning", Reason: "BackOff", Message: "Back-off restarting failed container"}

	var seconds []string
	for _, d := range f.timing.backOff {
		seconds = append(seconds, fmt.Sprint(d.Seconds()))
	}
	restart := f.stage("restart", f.phase, []matchExpression{
		{Key: f.jqFailingStatus() + " | .state.waiting.reason", Operator: "In", Values: []string{"CrashLoopBackOff"}},
	}, &stageDelay{DurationFrom: &expressionFrom{ExpressionFrom: fmt.Sprintf(
		`%s%s%s | untilNow((.lastState.terminated.finishedAt | latest) + [%s][[.restartCount, %d] | min])`,
		jqUntil, jqLatest, f.jqFailingStatus(), strings.Join(seconds, ", "), len(seconds)-1)}},
		f.restartTemplate())
	return []*kwokStage{exit, backOff, restart}
}

// stage is a Stage of the behaviour named <behaviour>-<step>, for the
// behaviour's pods that are not being deleted, in phase, and match when.
func (f failureStages) stage(step, phase string, when []matchExpression, delay *stageDelay, statusTemplate string) *kwokStage {
	s := &kwokStage{APIVersion: "kwok.x-k8s.io/v1alpha1", Kind: "Stage"}
	s.Metadata.Name = f.name + "-" + step
	s.Spec.ResourceRef.APIGroup = "v1"
	s.Spec.ResourceRef.Kind = "Pod"
	s.Spec.Selector.MatchExpressions = append([]matchExpression{
		{Key: labelKey(f.keys.label), Operator: "In", Values: []string{"true"}},
		{Key: ".metadata.deletionTimestamp", Operator: "DoesNotExist"},
		{Key: ".status.phase", Operator: "In", Values: []string{phase}},
	}, when...)
	s.Spec.Delay = delay
	s.Spec.Next.StatusTemplate = statusTemplate
	return s
}

func labelKey(label string) string { return fmt.Sprintf(".metadata.labels[%q]", label) }

// jqFailingStatus is a jq expression for the status of the failing container:
// the one the container annotation names, or else the first.
func (f failureStages) jqFailingStatus() string {
	return fmt.Sprintf(`(. as $pod | ((($pod.metadata.annotations[%q] // "") | select(. != "")) // $pod.spec.%s[0].name) as $name | $pod.status.%s[]? | select(.name == $name))`,
		f.keys.container, f.specField, f.statusField)
}

// templateHeader sets $now, $name (the failing container, as jqFailingStatus
// picks it) and $pod for a status template.
func (f failureStages) templateHeader() string {
	return fmt.Sprintf(`{{- $now := Now }}
{{- $pod := . }}
{{- $annotations := or .metadata.annotations dict }}
{{- $name := or (index $annotations %q) (index .spec.%s 0).name }}
`, f.keys.container, f.specField)
}

// statusesTemplate writes the status list with the failing container's status
// $status changed by failing (a template of a list item); the others stay.
func (f failureStages) statusesTemplate(failing string) string {
	return f.templateHeader() + f.statusField + `:
{{- range $status := .status.` + f.statusField + ` }}
{{- if eq $status.name $name }}
` + failing + `
{{- else }}
- {{ toJson $status }}
{{- end }}
{{- end }}
`
}

func (f failureStages) exitTemplate() string {
	return f.statusesTemplate(fmt.Sprintf(`- name: {{ $status.name | Quote }}
  image: {{ $status.image | Quote }}
  ready: false
  started: false
  restartCount: {{ $status.restartCount }}
  lastState: {{ toJson $status.lastState }}
  state:
    terminated:
      exitCode: {{ or (index $annotations %q) "1" | atoi }}
      reason: {{ or (index $annotations %q) "Error" | Quote }}
      message: {{ or (index $annotations %q) "" | Quote }}
      startedAt: {{ $status.state.running.startedAt | Quote }}
      finishedAt: {{ $now | Quote }}`, f.keys.exitCode, f.keys.reason, f.keys.message))
}

func (f failureStages) backOffTemplate() string {
	var backOff []string
	for _, d := range f.timing.backOff {
		backOff = append(backOff, fmt.Sprintf("%q", d.String()))
	}
	// The kubelet's words.
	return f.statusesTemplate(fmt.Sprintf(`{{- $backOff := index (list %s) (min (int64 $status.restartCount) %d) }}
- name: {{ $status.name | Quote }}
  image: {{ $status.image | Quote }}
  ready: false
  started: false
  restartCount: {{ $status.restartCount }}
  lastState:
    terminated: {{ toJson $status.state.terminated }}
  state:
    waiting:
      reason: CrashLoopBackOff
      message: {{ printf "back-off %%s restarting failed container=%%s pod=%%s_%%s(%%s)" $backOff $name $pod.metadata.name $pod.metadata.namespace $pod.metadata.uid | Quote }}`,
		strings.Join(backOff, " "), len(backOff)-1))
}

func (f failureStages) restartTemplate() string {
	return f.statusesTemplate(`- name: {{ $status.name | Quote }}
  image: {{ $status.image | Quote }}
  ready: false
  started: true
  restartCount: {{ add $status.restartCount 1 }}
  lastState: {{ toJson $status.lastState }}
  state:
    running:
      startedAt: {{ $now | Quote }}`)
}

// initContainersStartTemplate completes the init containers before the
// failing one and runs it; the kubelet runs init containers one by one.
func (f failureStages) initContainersStartTemplate() string {
	return f.templateHeader() + `{{- $before := true }}
initContainerStatuses:
{{- range $status := .status.initContainerStatuses }}
{{- if eq $status.name $name }}
{{- $before = false }}
- name: {{ $status.name | Quote }}
  image: {{ $status.image | Quote }}
  ready: false
  started: true
  restartCount: 0
  state:
    running:
      startedAt: {{ $now | Quote }}
{{- else if $before }}
- name: {{ $status.name | Quote }}
  image: {{ $status.image | Quote }}
  ready: true
  started: false
  restartCount: 0
  state:
    terminated:
      exitCode: 0
      reason: Completed
      startedAt: {{ $now | Quote }}
      finishedAt: {{ $now | Quote }}
{{- else }}
- {{ toJson $status }}
{{- end }}
{{- end }}
{{- if not .status.startTime }}
startTime: {{ $now | Quote }}
{{- end }}
`
}

// containersStartTemplate runs every container, as kwok's pod-ready does, but
// the crashing one is not ready, nor is the pod.
func (f failureStages) containersStartTemplate() string {
	return f.templateHeader() + `{{- $notReady := printf "containers with unready status: [%s]" $name }}
conditions:
- type: Ready
  status: "False"
  reason: ContainersNotReady
  message: {{ $notReady | Quote }}
  lastProbeTime: null
  lastTransitionTime: {{ $now | Quote }}
- type: ContainersReady
  status: "False"
  reason: ContainersNotReady
  message: {{ $notReady | Quote }}
  lastProbeTime: null
  lastTransitionTime: {{ $now | Quote }}
containerStatuses:
{{- range .spec.containers }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  ready: {{ ne .name $name }}
  started: true
  restartCount: 0
  state:
    running:
      startedAt: {{ $now | Quote }}
{{- end }}
phase: Running
startTime: {{ $now | Quote }}
`
}
