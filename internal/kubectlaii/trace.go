package kubectlaii

import (
	"bufio"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	servingv1 "github.com/aiinference/operator/api/v1"
)

// TraceReport is what `trace` shows: the object's history, oldest first.
type TraceReport struct {
	Namespace string       `json:"namespace"`
	Name      string       `json:"name"`
	Entries   []TraceEntry `json:"entries"`
}

// TraceEntry is one moment of the history.
type TraceEntry struct {
	Time time.Time `json:"time"`
	// Source is what it comes from: the object's events, its status, or a child's events.
	Source string `json:"source"`
	Type   string `json:"type"`
	Reason string `json:"reason"`
	What   string `json:"what"`
}

// trace merges the events of the object and its children (still kept by the API
// server, by default for an hour) with the times its status records.
func (e *env) trace(name string) error {
	v, err := e.load(name)
	if err != nil {
		return err
	}
	r := TraceReport{Namespace: v.obj.Namespace, Name: v.obj.Name}
	add := func(t time.Time, source, typ, reason, what string) {
		if !t.IsZero() {
			r.Entries = append(r.Entries, TraceEntry{Time: t, Source: source, Type: typ, Reason: reason, What: what})
		}
	}
	add(v.obj.CreationTimestamp.Time, "AIInference", "Normal", "Created", fmt.Sprintf("generation 1: %s on %s", v.obj.Spec.Model.Name, v.obj.Spec.Engine.Type))
	for _, c := range v.obj.Status.Conditions {
		// A condition keeps its transition time while only its reason changes:
		// this is when it took its status, with what it says now.
		add(c.LastTransitionTime.Time, "status", "Normal", c.Type+"="+string(c.Status), fmt.Sprintf("since then; now %s (generation %d): %s", c.Reason, c.ObservedGeneration, c.Message))
	}
	if f := v.obj.Status.LastFailure; f != nil {
		add(f.Time.Time, "status.lastFailure", "Warning", f.Reason, fmt.Sprintf("pod %s: %s", f.Pod, f.Message))
	}
	if ro := v.obj.Status.Rollout; ro != nil {
		// The rollout's decisions outlive their events.
		for _, d := range ro.History {
			typ := "Normal"
			if servingv1.IsWarningDecision(d.Decision) {
				typ = "Warning"
			}
			add(d.Time.Time, "status.rollout", typ, d.Decision, fmt.Sprintf("revision %s, step %d, canary weight %d%%: %s", d.Revision, d.Step+1, d.Weight, d.Message))
		}
	}
	// Children's events: the Deployment, its pods (the loader's restarts, the
	// scheduler's refusals) and the object itself.
	involved := []struct{ kind, name string }{{"AIInference", v.obj.Name}, {"Deployment", v.obj.Name}, {"Deployment", v.obj.Name + "-canary"}}
	for _, p := range v.pods {
		involved = append(involved, struct{ kind, name string }{"Pod", p.Name})
	}
	for _, inv := range involved {
		events, err := e.cs.CoreV1().Events(v.obj.Namespace).List(e.ctx, metav1.ListOptions{FieldSelector: fields.Set{
			"involvedObject.kind": inv.kind, "involvedObject.name": inv.name}.String()})
		if err != nil {
			return fmt.Errorf("listing events: %w", err)
		}
		for _, ev := range events.Items {
			what := strings.TrimSpace(ev.Message) + timesSeen(ev)
			source := inv.kind
			if inv.kind != "AIInference" {
				source += " " + inv.name
			}
			add(eventTime(ev), source, ev.Type, ev.Reason, what)
		}
	}
	sort.SliceStable(r.Entries, func(i, j int) bool { return r.Entries[i].Time.Before(r.Entries[j].Time) })
	if done, err := e.printStructured("AIInferenceTrace", r); done {
		return err
	}
	for _, en := range r.Entries {
		mark := " "
		if en.Type == corev1.EventTypeWarning {
			mark = "!"
		}
		fmt.Fprintf(e.out, "%s %s %-28s %-24s %s\n", en.Time.UTC().Format(time.RFC3339), mark, en.Source, en.Reason, en.What)
	}
	return nil
}

// logs prints the engine's (or loader's) log of each pod, lines prefixed with the pod.
func (e *env) logs(name string, loader bool, tail int64) error {
	v, err := e.load(name)
	if err != nil {
		return err
	}
	container := servingv1.EngineContainerName
	if loader {
		container = servingv1.LoaderContainerName
	}
	if len(v.pods) == 0 {
		return fmt.Errorf("AIInference %s/%s has no pods", v.obj.Namespace, v.obj.Name)
	}
	for _, p := range v.pods {
		opts := &corev1.PodLogOptions{Container: container}
		if tail >= 0 {
			opts.TailLines = &tail
		}
		stream, err := e.cs.CoreV1().Pods(p.Namespace).GetLogs(p.Name, opts).Stream(e.ctx)
		if err != nil {
			fmt.Fprintf(e.out, "[%s] (no %s log: %v)\n", p.Name, container, err)
			continue
		}
		copyPrefixed(e.out, stream, "["+p.Name+"] ")
		_ = stream.Close()
	}
	return nil
}

func copyPrefixed(out io.Writer, in io.Reader, prefix string) {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		fmt.Fprintln(out, prefix+sc.Text())
	}
}
