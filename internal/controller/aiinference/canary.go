package aiinference

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	servingv1 "github.com/aiinference/operator/api/v1"
)

// A canary rollout (rollout.strategy Canary) runs the new spec as a second
// Deployment, <name>-canary, with its own loader ConfigMap, next to the stable
// Deployment <name>, which keeps the template it runs until promotion. The state
// of the rollout (step, weight, analysis runs) lives in status.rollout: time and
// analysis results cannot be read back from the children.

// maxAnalysisRuns and maxHistory bound status.rollout's lists.
const (
	maxAnalysisRuns = 10
	maxHistory      = 20
)

// rolloutPlan is what the canary rollout wants of the children in this pass.
type rolloutPlan struct {
	// status is status.rollout after this pass.
	status *servingv1.RolloutStatus
	// keepStableTemplate is true while the stable Deployment must keep the
	// template it runs (a canary is in progress or was rolled back).
	keepStableTemplate bool
	// stableReplicas is the stable Deployment's replica count.
	stableReplicas int32
	// canaryReplicas is the canary Deployment's replica count; 0: no canary.
	canaryReplicas int32
	// decisions are the decisions taken in this pass, for events and metrics.
	decisions []servingv1.RolloutDecision
	// requeue is when the rollout must be looked at again (a pause ends, an
	// analysis run is due); 0: on the next change of a child.
	requeue time.Duration
}

// canaryActive is true when the plan runs a canary next to the stable pods.
func (p *rolloutPlan) canaryActive() bool { return p != nil && p.canaryReplicas > 0 }

// isCanary is true when the object rolls out with the Canary strategy.
func isCanary(obj *servingv1.AIInference) bool {
	r := obj.Spec.Rollout
	return r != nil && r.Strategy == servingv1.RolloutCanary && r.Canary != nil
}

func canaryMaxSurge(c *servingv1.CanarySpec) int32 { return ptr.Deref(c.MaxSurge, 1) }

// reducedStableReplicas is the stable set's size while a canary runs: one stable
// replica fewer for each canary pod beyond the surge, but never none.
func reducedStableReplicas(obj *servingv1.AIInference) int32 {
	c := obj.Spec.Rollout.Canary
	want := obj.DesiredReplicas()
	return max(min(want, want-canaryReplicaCount(c)+canaryMaxSurge(c)), 1)
}

func canaryReplicaCount(c *servingv1.CanarySpec) int32 { return max(c.Replicas, 1) }

// rolloutInput is what the rollout decides on.
type rolloutInput struct {
	obj        *servingv1.AIInference
	now        time.Time
	desiredRev string
	// stableRev is the revision the stable Deployment runs; "" when it does not exist.
	stableRev string
	// stableRolledOut is true when the stable Deployment runs desiredRev on
	// stableWanted ready replicas and no others.
	stableRolledOut bool
	// stableReady and canaryReady are the ready replicas of each set; canaryReady
	// counts only canary pods of desiredRev.
	stableReady, canaryReady int32
	// stableReadyCurrent counts the stable set's serving pods of desiredRev.
	stableReadyCurrent int32
	// loadsHalted is the reason the canary's loads stopped, if they did.
	loadsHalted string
	// analyze runs one analysis of the current step.
	analyze func(step int32, a *servingv1.AnalysisStep) servingv1.AnalysisRun
}

// planRollout advances a canary rollout by what was observed: it starts a canary
// for a new revision, moves through the steps, rolls back or promotes. Each
// case is one transition of status.rollout, named by the method that makes it.
func planRollout(in rolloutInput) rolloutPlan {
	p := newRolloutPass(in)
	switch st := p.st; {
	case in.stableRev == "" || in.obj.DesiredReplicas() == 0:
		p.applyDirectly()
	case st.Phase == servingv1.RolloutPromoting && st.CanaryRevision == in.desiredRev:
		p.promote()
	case in.stableRev == in.desiredRev:
		p.settle()
	default:
		p.runCanary()
	}
	return p.plan
}

// rolloutPass is one pass of the rollout machine: what it decides on, the
// status it moves and the plan it builds.
type rolloutPass struct {
	in   rolloutInput
	c    *servingv1.CanarySpec
	st   *servingv1.RolloutStatus
	plan rolloutPlan
	// newAbort and newPromote are true for an annotation not handled before.
	newAbort, newPromote bool
}

func newRolloutPass(in rolloutInput) *rolloutPass {
	obj := in.obj
	st := &servingv1.RolloutStatus{}
	if obj.Status.Rollout != nil {
		st = obj.Status.Rollout.DeepCopy()
	}
	abort, promote := obj.Annotations[servingv1.AnnotationAbort], obj.Annotations[servingv1.AnnotationPromote]
	p := &rolloutPass{in: in, c: obj.Spec.Rollout.Canary, st: st,
		plan:     rolloutPlan{status: st, stableReplicas: obj.DesiredReplicas()},
		newAbort: abort != "" && abort != st.LastHandledAbort, newPromote: promote != "" && promote != st.LastHandledPromote}
	st.LastHandledAbort, st.LastHandledPromote = abort, promote
	return p
}

// decide records a decision in status.rollout.history and for events.
func (p *rolloutPass) decide(decision, message string) {
	st := p.st
	d := servingv1.RolloutDecision{Time: metav1.NewTime(p.in.now.Truncate(time.Second)), Decision: decision,
		Revision: st.CanaryRevision, Step: st.Step, Weight: st.Weight, Message: message}
	p.plan.decisions = append(p.plan.decisions, d)
	st.History = append(st.History, d)
	if n := len(st.History); n > maxHistory {
		st.History = st.History[n-maxHistory:]
	}
}

// inProgress is true while a canary runs its steps.
func (p *rolloutPass) inProgress() bool {
	switch p.st.Phase {
	case servingv1.RolloutProgressing, servingv1.RolloutPaused, servingv1.RolloutInconclusive:
		return true
	}
	return false
}

// applyDirectly: the first version has nothing to be compared with, and no
// replicas means no traffic to judge, so the stable Deployment takes the spec.
func (p *rolloutPass) applyDirectly() {
	st := p.st
	st.StableRevision, st.Weight = p.in.desiredRev, 0
	if p.inProgress() && st.CanaryRevision != p.in.desiredRev {
		p.decide(servingv1.DecisionSuperseded, "no stable replica to compare the canary with")
		st.Phase = ""
	}
}

// promote: every step passed and the stable pods take the canary's revision,
// traffic following the ready replicas; Promoted once they all run it.
func (p *rolloutPass) promote() {
	st, in := p.st, p.in
	if in.stableRev == in.desiredRev && in.stableRolledOut {
		st.Phase, st.StableRevision, st.Weight, st.Message = servingv1.RolloutPromoted, in.desiredRev, 0, ""
		p.decide(servingv1.DecisionPromoted, fmt.Sprintf("the stable pods run revision %s; the canary's pods are removed", in.desiredRev))
		return
	}
	p.runBothSets()
	p.promotionTraffic()
	st.Message = fmt.Sprintf("the stable pods take revision %s while the canary serves; traffic follows the ready replicas", in.desiredRev)
}

// promotionDrain is how long the stable pods of the earlier revision keep
// their template once a promotion begins: the Gateway applies a route's new
// weights a second or more after it is written (Traefik throttles its
// provider's changes), and the stable set, replaced without a surge, may have
// no ready pod meanwhile. 5 s was seen too short on a loaded host (76 of 1331
// requests answered 503 during a promotion through Traefik).
const promotionDrain = 10 * time.Second

// promotionTraffic: while promoting, traffic goes to the pods of the new
// revision alone (the canary's, then the stable set's as they become ready),
// and the stable set is replaced only once promotionDrain has passed since the
// promotion began, so that no request is sent to a set with no ready pod.
func (p *rolloutPass) promotionTraffic() {
	st, in := p.st, p.in
	st.Weight = readyShare(in.canaryReady, in.stableReadyCurrent)
	if in.stableRev == in.desiredRev {
		return
	}
	for i := len(st.History) - 1; i >= 0; i-- {
		d := st.History[i]
		if d.Decision != servingv1.DecisionPromoting || d.Revision != st.CanaryRevision {
			continue
		}
		if end := d.Time.Add(promotionDrain); in.now.Before(end) {
			p.plan.keepStableTemplate = true
			p.plan.requeue = soonestOf(p.plan.requeue, end.Sub(in.now))
		}
		return
	}
}

// settle: the spec is what the stable pods run (possibly because it went
// back to it during a canary), so there is nothing to roll out.
func (p *rolloutPass) settle() {
	st, in := p.st, p.in
	if p.inProgress() || st.Phase == servingv1.RolloutPromoting {
		p.decide(servingv1.DecisionSuperseded, fmt.Sprintf("the spec is back to the stable revision %s; the canary of %s is removed", in.desiredRev, st.CanaryRevision))
		st.Phase = ""
	}
	st.StableRevision, st.Weight, st.Message, st.StepVerdicts = in.desiredRev, 0, "", nil
}

// runBothSets sizes the stable and canary Deployments for a canary in progress.
func (p *rolloutPass) runBothSets() {
	p.plan.stableReplicas = reducedStableReplicas(p.in.obj)
	p.plan.canaryReplicas = canaryReplicaCount(p.c)
}

// runCanary: a revision other than the stable one is wanted. It runs as a
// canary through the steps until it is promoted or rolled back.
func (p *rolloutPass) runCanary() {
	st, in := p.st, p.in
	p.startCanary()
	st.StableRevision = in.stableRev
	p.plan.keepStableTemplate = true
	if st.Phase == servingv1.RolloutRolledBack {
		st.Weight = 0
		return
	}
	p.runBothSets()
	switch {
	case p.newAbort:
		p.rollBack(servingv1.DecisionAborted, "aborted by hand (annotation "+servingv1.AnnotationAbort+"); all traffic is back on the stable pods")
		return
	case in.loadsHalted != "":
		p.rollBack(servingv1.DecisionRolledBack, fmt.Sprintf("the canary's model loads stopped (%s); all traffic is back on the stable pods", in.loadsHalted))
		return
	}
	if !p.stepStarted() || p.paused() {
		return
	}
	if rolledBack := p.runStep(); rolledBack {
		return
	}
	p.describe()
}

// startCanary starts a canary for a revision not yet tried, for one rolled back
// and retried, or after the last rollout ended.
func (p *rolloutPass) startCanary() {
	st, in, obj := p.st, p.in, p.in.obj
	retry := obj.Annotations[servingv1.AnnotationRequestedAt] != obj.Status.LastHandledRequestedAt
	if st.CanaryRevision == in.desiredRev && !(st.Phase == servingv1.RolloutRolledBack && retry) && st.Phase != "" && st.Phase != servingv1.RolloutPromoted {
		return
	}
	if p.inProgress() && st.CanaryRevision != in.desiredRev {
		p.decide(servingv1.DecisionSuperseded, fmt.Sprintf("a newer spec (revision %s) replaces the canary of %s", in.desiredRev, st.CanaryRevision))
	}
	*st = servingv1.RolloutStatus{StableRevision: in.stableRev, CanaryRevision: in.desiredRev, Phase: servingv1.RolloutProgressing,
		History: st.History, LastHandledAbort: st.LastHandledAbort, LastHandledPromote: st.LastHandledPromote}
	p.newAbort, p.newPromote = false, false
	p.decide(servingv1.DecisionCanaryStarted, fmt.Sprintf("revision %s starts as a canary of %d pods next to the stable revision %s", in.desiredRev, canaryReplicaCount(p.c), in.stableRev))
}

// rollBack sends all traffic back to the stable pods and removes the canary's.
func (p *rolloutPass) rollBack(decision, message string) {
	st := p.st
	st.Weight = 0
	p.decide(decision, message)
	st.Phase, st.StepStartedAt, st.Message = servingv1.RolloutRolledBack, nil, message
	p.plan.stableReplicas, p.plan.canaryReplicas = p.in.obj.DesiredReplicas(), 0
}

// stepStarted starts the first step once the canary's pods are all ready.
func (p *rolloutPass) stepStarted() bool {
	st := p.st
	if st.StepStartedAt != nil {
		return true
	}
	if p.in.canaryReady < p.plan.canaryReplicas {
		st.Message = fmt.Sprintf("waiting for the canary's pods: %d of %d ready", p.in.canaryReady, p.plan.canaryReplicas)
		return false
	}
	startStep(st, p.c, p.in.now)
	p.decide(servingv1.DecisionStepStarted, fmt.Sprintf("step %d of %d: the canary takes %d%% of the traffic", st.Step+1, len(p.c.Steps), st.Weight))
	return true
}

// paused follows the pause annotation: Paused while it is set, Progressing
// again once it is gone.
func (p *rolloutPass) paused() bool {
	st := p.st
	switch paused := p.in.obj.Annotations[servingv1.AnnotationPaused] == "true"; {
	case paused && st.Phase != servingv1.RolloutPaused:
		st.Phase = servingv1.RolloutPaused
		p.decide(servingv1.DecisionPaused, "paused by hand (annotation "+servingv1.AnnotationPaused+")")
	case !paused && st.Phase == servingv1.RolloutPaused:
		st.Phase = servingv1.RolloutProgressing
		p.decide(servingv1.DecisionResumed, "resumed: the annotation "+servingv1.AnnotationPaused+" is gone")
	}
	if st.Phase != servingv1.RolloutPaused {
		return false
	}
	st.Message = fmt.Sprintf("paused by hand at step %d of %d; remove the annotation %s to go on", st.Step+1, len(p.c.Steps), servingv1.AnnotationPaused)
	return true
}

// runStep runs the current step: promoted by hand, a pause that ends, or an
// analysis that passes, fails (rolledBack) or cannot judge.
func (p *rolloutPass) runStep() (rolledBack bool) {
	st := p.st
	step := p.c.Steps[st.Step]
	switch {
	case p.newPromote:
		p.advance(servingv1.DecisionPromotedStep, fmt.Sprintf("step %d promoted by hand (annotation %s)", st.Step+1, servingv1.AnnotationPromote))
	case step.Pause != nil:
		if step.Pause.Duration != nil && !p.in.now.Before(st.StepStartedAt.Add(step.Pause.Duration.Duration)) {
			p.advance(servingv1.DecisionPauseEnded, fmt.Sprintf("the pause of step %d ended", st.Step+1))
		}
	case step.Analysis != nil && st.Phase != servingv1.RolloutInconclusive:
		switch analysisStep(st, step.Analysis, p.in) {
		case servingv1.VerdictFail:
			p.rollBack(servingv1.DecisionRolledBack, fmt.Sprintf("analysis failed at step %d: %s; all traffic is back on the stable pods", st.Step+1, failedChecks(st.Analysis)))
			return true
		case servingv1.VerdictInconclusive:
			st.Phase = servingv1.RolloutInconclusive
			p.decide(servingv1.DecisionInconclusive, fmt.Sprintf("analysis at step %d could not judge the canary (%s); promote or abort by hand", st.Step+1, failedChecks(st.Analysis)))
		case servingv1.VerdictPass:
			p.advance(servingv1.DecisionAnalysisPassed, fmt.Sprintf("analysis passed at step %d", st.Step+1))
		}
	}
	return false
}

// advance ends the current step: the next one starts, or Promoting after the last.
func (p *rolloutPass) advance(decision, message string) {
	st := p.st
	p.decide(decision, message)
	st.Step++
	st.StepVerdicts = nil
	if int(st.Step) >= len(p.c.Steps) {
		st.Phase, st.StepStartedAt = servingv1.RolloutPromoting, nil
		p.decide(servingv1.DecisionPromoting, fmt.Sprintf("every step passed: the stable pods take revision %s", p.in.desiredRev))
		return
	}
	st.Phase = servingv1.RolloutProgressing
	startStep(st, p.c, p.in.now)
	p.decide(servingv1.DecisionStepStarted, fmt.Sprintf("step %d of %d: the canary takes %d%% of the traffic", st.Step+1, len(p.c.Steps), st.Weight))
}

// describe sets when to look again and the message for the phase the pass ends in.
func (p *rolloutPass) describe() {
	st, in := p.st, p.in
	p.plan.requeue = nextDue(st, p.c, in.now)
	switch st.Phase {
	case servingv1.RolloutProgressing:
		st.Message = describeStep(st, p.c)
	case servingv1.RolloutPromoting:
		p.plan.keepStableTemplate = false
		p.promotionTraffic()
		st.Message = fmt.Sprintf("every step passed; the stable pods take revision %s", in.desiredRev)
	case servingv1.RolloutInconclusive:
		st.Message = fmt.Sprintf("analysis at step %d could not judge the canary: %s; set the annotation %s to go on or %s to roll back",
			st.Step+1, failedChecks(st.Analysis), servingv1.AnnotationPromote, servingv1.AnnotationAbort)
	}
}

// startStep begins the current step: its weight applies from now.
func startStep(st *servingv1.RolloutStatus, c *servingv1.CanarySpec, now time.Time) {
	st.StepStartedAt = ptr.To(metav1.NewTime(now.Truncate(time.Second)))
	st.Weight = c.Steps[st.Step].Weight
}

// describeStep says where the current step is and what it waits for.
func describeStep(st *servingv1.RolloutStatus, c *servingv1.CanarySpec) string {
	if st.StepStartedAt == nil || int(st.Step) >= len(c.Steps) {
		return st.Message
	}
	step := c.Steps[st.Step]
	msg := fmt.Sprintf("step %d of %d (weight %d%%)", st.Step+1, len(c.Steps), step.Weight)
	switch {
	case step.Pause != nil && step.Pause.Duration == nil:
		return msg + " holds until promoted: set the annotation " + servingv1.AnnotationPromote
	case step.Pause != nil:
		return msg + " holds until " + st.StepStartedAt.Add(step.Pause.Duration.Duration).UTC().Format(time.RFC3339)
	}
	msg += ": " + tally(st.StepVerdicts, step.Analysis)
	if last := lastRunOfStep(st); last != nil {
		msg += "; last run " + string(last.Verdict)
	}
	due, _ := stepDue(st, c)
	return msg + "; next run at " + due.UTC().Format(time.RFC3339)
}

// rolloutRecheck bounds the time between two looks at a rollout in progress:
// its clock is in status, and a look that finds nothing due writes nothing.
const rolloutRecheck = 30 * time.Second

// nextDue is when the rollout next needs a look without any change of the
// children: a timed pause ends or an analysis run is due, and at most
// rolloutRecheck while a rollout is in progress; 0 when none is.
func nextDue(st *servingv1.RolloutStatus, c *servingv1.CanarySpec, now time.Time) time.Duration {
	switch st.Phase {
	case servingv1.RolloutProgressing, servingv1.RolloutPaused, servingv1.RolloutInconclusive, servingv1.RolloutPromoting:
	default:
		return 0
	}
	due, ok := stepDue(st, c)
	if !ok || st.Phase != servingv1.RolloutProgressing {
		return rolloutRecheck
	}
	// Times in status are kept to the second: never ask for a look in the past.
	return min(max(due.Sub(now), time.Second), rolloutRecheck)
}

// stepDue is when the current step's pause ends or its next analysis run is due.
func stepDue(st *servingv1.RolloutStatus, c *servingv1.CanarySpec) (time.Time, bool) {
	if st.StepStartedAt == nil || int(st.Step) >= len(c.Steps) {
		return time.Time{}, false
	}
	switch step := c.Steps[st.Step]; {
	case step.Pause != nil && step.Pause.Duration != nil:
		return st.StepStartedAt.Add(step.Pause.Duration.Duration), true
	case step.Analysis != nil:
		if last := lastRunOfStep(st); last != nil {
			return last.Time.Add(analysisInterval(step.Analysis)), true
		}
		return st.StepStartedAt.Add(analysisInterval(step.Analysis)), true
	}
	return time.Time{}, false
}

// readyShare is the canary's share of the ready replicas, in percent: while
// the stable set is replaced, traffic goes where pods are ready.
func readyShare(canaryReady, stableReady int32) int32 {
	if canaryReady+stableReady == 0 {
		return 0
	}
	return int32(float64(canaryReady) * 100 / float64(canaryReady+stableReady))
}

// planRollout plans this pass of a canary rollout from what observe saw.
func (r *Reconciler) planRollout(ctx context.Context, s *scope) {
	in := rolloutInput{obj: s.obj, now: s.now, desiredRev: s.templateHash, loadsHalted: s.loads.halted(),
		analyze: func(step int32, a *servingv1.AnalysisStep) servingv1.AnalysisRun {
			return r.runAnalysis(ctx, s.obj, step, a)
		}}
	if d := s.obs.deployment; d != nil {
		in.stableRev = d.Spec.Template.Annotations[servingv1.AnnotationTemplateHash]
		in.stableReady = d.Status.ReadyReplicas
		in.stableRolledOut = rolledOut(d, ptr.Deref(d.Spec.Replicas, 1))
	}
	for _, p := range s.obs.pods {
		switch {
		case p.Canary && p.Current && p.Serves:
			in.canaryReady++
		case !p.Canary && p.Current && p.Serves:
			in.stableReadyCurrent++
		}
	}
	plan := planRollout(in)
	plan.status.TrafficSplit = trafficSplit(s.obj)
	if plan.status.TrafficSplit == splitReplicaCount && plan.canaryActive() {
		// One Service selects both sets: the share is what the ready pods make it.
		plan.status.Weight = readyShare(in.canaryReady, in.stableReady)
	}
	s.obs.rollout = &plan
}
