package aiinference

import (
	"context"
	"fmt"
	"math"
	"net"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/autoscale"
)

// The autoscaler (spec.autoscaling) is a step of the reconcile, so that one
// writer sets the Deployment's replicas and status: every AutoscaleInterval it
// reads the signals from the /metrics of each serving pod of the current spec,
// and moves status.autoscaling.desiredReplicas, which DesiredReplicas returns
// and the Deployment runs. The readings go to metrics; status changes only
// when the count does, or when the autoscaler starts or stops holding it.

// DefaultAutoscaleInterval is how often the signals are read.
const DefaultAutoscaleInterval = 10 * time.Second

// maxScalingDecisions bounds status.autoscaling.decisions.
const maxScalingDecisions = 10

// scrapeTimeout bounds one read of one pod's /metrics.
const scrapeTimeout = 2 * time.Second

// autoscalerMemory is what the autoscaler remembers of each object between
// passes: its recent recommendations and its last reading.
type autoscalerMemory struct {
	mu      sync.Mutex
	objects map[types.NamespacedName]*autoscaled
}

type autoscaled struct {
	history autoscale.History
	// idleSince is when the model was last seen turning idle; zero while busy.
	idleSince time.Time
	// read is when the signals were last read; hold is why the count was held
	// then ("" when it was not).
	read time.Time
	hold *problem
	// prefixPicks is the routers' count of prefix-affine picks per pod at the
	// last reading; recentPrefix weighs the picks since, each reading's by
	// half every prefixHalfLife: which replicas' caches draw traffic now.
	prefixPicks, recentPrefix map[string]float64
	picksRead                 time.Time
}

// prefixHalfLife is how fast the router's past picks of a replica weigh
// less in recentPrefix.
const prefixHalfLife = 5 * time.Minute

// notePrefixPicks adds a reading of the routers' prefix picks; a count below
// the last one (a router restarted) counts from zero.
func (a *autoscaled) notePrefixPicks(picks map[string]float64, now time.Time) {
	decay := 1.0
	if !a.picksRead.IsZero() {
		decay = math.Pow(0.5, now.Sub(a.picksRead).Seconds()/prefixHalfLife.Seconds())
	}
	recent := make(map[string]float64, len(picks))
	for pod, n := range picks {
		added := n
		if last, ok := a.prefixPicks[pod]; ok && n >= last {
			added = n - last
		}
		recent[pod] = a.recentPrefix[pod]*decay + added
	}
	a.prefixPicks, a.recentPrefix, a.picksRead = picks, recent, now
}

func (m *autoscalerMemory) of(key types.NamespacedName) *autoscaled {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.objects == nil {
		m.objects = map[types.NamespacedName]*autoscaled{}
	}
	if m.objects[key] == nil {
		m.objects[key] = &autoscaled{}
	}
	return m.objects[key]
}

func (m *autoscalerMemory) forget(key types.NamespacedName) {
	m.mu.Lock()
	delete(m.objects, key)
	m.mu.Unlock()
}

// autoscaleView is what the autoscaler step saw in this pass.
type autoscaleView struct {
	// hold is why the count holds (signals missing or unreadable); nil when the
	// signals were read.
	hold *problem
	// requeue is when the signals are next due.
	requeue time.Duration
	// noActivator is true when minReplicas 0 cannot be honoured: no activator
	// runs to hold the requests of a model at zero.
	noActivator bool
}

// autoscale runs the autoscaler for one pass: it reads the signals when they
// are due and moves the count as they ask. Missing, unreadable or NaN signals
// hold the count where it is, and say so.
func (r *Reconciler) autoscale(ctx context.Context, s *scope) {
	obj, a := s.obj, s.obj.Spec.Autoscaling
	if a == nil {
		if obj.Status.Autoscaling != nil {
			s.setAutoscalingStatus(nil)
		}
		return
	}
	key := client.ObjectKeyFromObject(obj)
	mem := r.autoscaler.of(key)
	interval := r.autoscaleInterval()
	current := obj.DesiredReplicas()
	if st := obj.Status.Autoscaling; st == nil || st.DesiredReplicas != current {
		// First sight, or the spec's bounds moved past the count.
		from := int32(0)
		if st != nil {
			from = st.DesiredReplicas
		}
		s.scaleTo(current, servingv1.ScalingDecisionBounds, fmt.Sprintf("the count starts at %d, within minReplicas %d and maxReplicas %d", current, a.Min(), a.MaxReplicas), from, nil)
	}
	s.obs.autoscale = &autoscaleView{hold: mem.hold, requeue: interval, noActivator: a.Min() == 0 && r.holder(s) == ""}
	if current == 0 {
		// No pod to read: a request the activator or the router holds is the
		// only signal. The router is asked every interval; the activator wakes
		// the object itself.
		s.obs.autoscale.hold = nil
		held := float64(r.held(key))
		if s.routed() {
			reading, hold := r.readRouter(ctx, s)
			if hold != nil {
				mem.hold, s.obs.autoscale.hold = hold, hold
				return
			}
			held += reading.Waiting
		}
		if held > 0 {
			mem.idleSince, mem.history = time.Time{}, autoscale.History{}
			s.scaleTo(1, servingv1.ScalingDecisionUp, fmt.Sprintf("%v request(s) held by the %s: a replica starts", held, r.holder(s)), 0, nil)
		}
		return
	}
	if due := mem.read.Add(interval); s.now.Before(due) {
		s.obs.autoscale.requeue = due.Sub(s.now)
		return
	}
	mem.read = s.now
	sums, serving, hold := r.readSignals(ctx, s, a)
	if hold == nil && s.routed() {
		// What waits in the router waits for the engines too: it is queue
		// depth they have not seen yet.
		var reading autoscale.RouterReading
		reading, hold = r.readRouter(ctx, s)
		sums[servingv1.SignalQueueDepth] += reading.Waiting
		mem.notePrefixPicks(reading.PrefixPicks, s.now)
	}
	mem.hold, s.obs.autoscale.hold = hold, hold
	if hold != nil {
		return
	}
	want, readings := autoscale.Recommend(a, current, serving, sums)
	metricsState.recordSignals(key, readings)
	idle := autoscale.Idle(sums) && r.held(key) == 0
	switch {
	case !idle:
		mem.idleSince = time.Time{}
		want = max(want, 1) // a model at work never goes to zero
	case mem.idleSince.IsZero():
		mem.idleSince = s.now
	}
	up, down := a.StabilizationWindows()
	mem.history.Add(autoscale.Recommendation{Time: s.now, Replicas: want}, max(up, down))
	next := mem.history.Stabilize(s.now, current, up, down)
	if next == 0 && (r.holder(s) == "" || s.now.Sub(mem.idleSince) < a.IdleTime()) {
		// Zero only after idleBeforeZero of idleness, and only with an
		// activator or a router to hold the next request.
		next = 1
	}
	switch {
	case next > current:
		s.scaleTo(next, servingv1.ScalingDecisionUp, describeReadings(readings), current, readings)
	case next == 0:
		s.scaleTo(0, servingv1.ScalingDecisionDown, fmt.Sprintf("idle for %s (no request running, waiting or held): to zero; the %s holds the next request", a.IdleTime(), r.holder(s)), current, readings)
	case next < current:
		if s.routed() {
			r.setDeletionCosts(ctx, s, mem.recentPrefix)
		}
		s.scaleTo(next, servingv1.ScalingDecisionDown, describeReadings(readings), current, readings)
	}
}

// holder is what holds the requests of the model at zero: the router for a
// routed model (its Service leads there), else the activator; "" when
// neither runs.
func (r *Reconciler) holder(s *scope) string {
	switch {
	case s.routed():
		return "router"
	case r.Activator != nil:
		return "activator"
	}
	return ""
}

// readRouter reads what each ready router pod says of the model, at once,
// and adds it up. A router pod that cannot be read holds the count, as an
// engine does.
func (r *Reconciler) readRouter(ctx context.Context, s *scope) (autoscale.RouterReading, *problem) {
	total := autoscale.RouterReading{PrefixPicks: map[string]float64{}}
	if s.router.metricsPort == 0 {
		return total, &problem{servingv1.ReasonMetricsUnavailable, fmt.Sprintf(
			"the router's Service %s/%s names no port \"metrics\", so what waits in the router cannot be read: the count holds at %d", r.Options.OperatorNamespace, r.routerService(), s.obj.DesiredReplicas())}
	}
	addrs := s.router.addresses
	readings := make([]autoscale.RouterReading, len(addrs))
	errs := make([]error, len(addrs))
	var wg sync.WaitGroup
	for i, ip := range addrs {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, scrapeTimeout)
			defer cancel()
			url := "http://" + net.JoinHostPort(ip, strconv.Itoa(int(s.router.metricsPort))) + "/metrics"
			readings[i], errs[i] = autoscale.ScrapeRouter(ctx, url, s.obj.Namespace, s.obj.Name)
		})
	}
	wg.Wait()
	for i, ip := range addrs {
		if errs[i] != nil {
			return total, &problem{servingv1.ReasonMetricsUnavailable, fmt.Sprintf(
				"cannot read what the router's pod at %s holds: %v; the count holds at %d until every ready router pod can be read", ip, errs[i], s.obj.DesiredReplicas())}
		}
		total.Waiting += readings[i].Waiting
		for pod, n := range readings[i].PrefixPicks {
			total.PrefixPicks[pod] += n
		}
	}
	return total, nil
}

// podDeletionCost is the annotation the ReplicaSet controller reads to
// choose which pods go first when it scales down: the lowest cost.
const podDeletionCost = "controller.kubernetes.io/pod-deletion-cost"

// setDeletionCosts marks each serving pod of the current spec, before a
// scale-down, with how many requests the router sent it for the prefixes it
// holds, lately (recentPrefix), so that the replica whose cache draws the
// least traffic goes first and scaling costs the fewest cache hits. A pod
// that cannot be marked only loses that preference.
func (r *Reconciler) setDeletionCosts(ctx context.Context, s *scope, recentPrefix map[string]float64) {
	for _, p := range s.obs.pods {
		if !p.Current || p.Canary {
			continue
		}
		cost := strconv.Itoa(int(min(recentPrefix[p.Name], math.MaxInt32)))
		patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:%q}}}`, podDeletionCost, cost)
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: s.obj.Namespace, Name: p.Name}}
		if err := r.Patch(ctx, pod, client.RawPatch(types.MergePatchType, patch)); err != nil {
			log.FromContext(ctx).V(1).Info("Cannot set the pod's deletion cost", "pod", p.Name, "error", err.Error())
		}
	}
}

// held is how many requests the activator holds for the model.
func (r *Reconciler) held(key types.NamespacedName) int {
	if r.Activator == nil {
		return 0
	}
	return r.Activator.Held(key)
}

func (r *Reconciler) autoscaleInterval() time.Duration {
	if r.Options.AutoscaleInterval > 0 {
		return r.Options.AutoscaleInterval
	}
	return DefaultAutoscaleInterval
}

// readSignals reads the wanted signals of every serving pod of the current
// spec, at once, and sums them. A pod that cannot be read holds the count: a
// sum without it would ask for too few replicas.
func (r *Reconciler) readSignals(ctx context.Context, s *scope, a *servingv1.AutoscalingSpec) (autoscale.Signals, int32, *problem) {
	var pods []podView
	for _, p := range s.obs.pods {
		if p.Current && !p.Canary && p.Serves {
			pods = append(pods, p)
		}
	}
	if len(pods) == 0 {
		return nil, 0, &problem{servingv1.ReasonNoServingReplicas, "no replica of the current spec serves yet, so there is no signal to read: the count holds"}
	}
	port := s.engine.MetricsPort()
	if port == 0 {
		port = enginePort(s.obj, s.engine)
	}
	wanted := autoscale.Wanted(a)
	if a.Min() == 0 {
		// Going to zero needs to know the model is idle: nothing running or waiting.
		wanted = autoscale.WithIdleSignals(wanted, s.engine.SignalMetrics)
	}
	results := make([]autoscale.Signals, len(pods))
	errs := make([]error, len(pods))
	var wg sync.WaitGroup
	for i, p := range pods {
		wg.Go(func() {
			if p.IP == "" {
				errs[i] = fmt.Errorf("pod %s has no IP", p.Name)
				return
			}
			ctx, cancel := context.WithTimeout(ctx, scrapeTimeout)
			defer cancel()
			url := "http://" + net.JoinHostPort(p.IP, strconv.Itoa(int(port))) + "/metrics"
			results[i], errs[i] = autoscale.Scrape(ctx, url, wanted, s.engine.SignalMetrics)
		})
	}
	wg.Wait()
	sums := autoscale.Signals{}
	for i, p := range pods {
		if errs[i] != nil {
			return nil, 0, &problem{servingv1.ReasonMetricsUnavailable, fmt.Sprintf(
				"cannot read the signals of pod %s: %v; the count holds at %d until every serving replica can be read", p.Name, errs[i], s.obj.DesiredReplicas())}
		}
		for sig, v := range results[i] {
			sums[sig] += v
		}
	}
	return sums, int32(len(pods)), nil
}

// scaleTo moves the count, recording the decision in status.autoscaling.
func (s *scope) scaleTo(to int32, reason, message string, from int32, readings []servingv1.SignalReading) {
	st := &servingv1.AutoscalingStatus{}
	if s.obj.Status.Autoscaling != nil {
		st = s.obj.Status.Autoscaling.DeepCopy()
	}
	now := metav1.NewTime(s.now.Truncate(time.Second))
	st.DesiredReplicas, st.LastScaleTime = to, &now
	if readings != nil {
		st.Signals = readings
	}
	st.Decisions = append(st.Decisions, servingv1.ScalingDecision{Time: now, From: from, To: to, Reason: reason, Message: message})
	if n := len(st.Decisions); n > maxScalingDecisions {
		st.Decisions = st.Decisions[n-maxScalingDecisions:]
	}
	s.setAutoscalingStatus(st)
	if s.deployment != nil {
		s.deployment.Spec.Replicas = ptr.To(s.obj.DesiredReplicas())
	}
}

// setAutoscalingStatus sets status.autoscaling on the object for the rest of
// the pass (DesiredReplicas reads it), keeping the status the pass started
// from for the status write.
func (s *scope) setAutoscalingStatus(st *servingv1.AutoscalingStatus) {
	if s.statusRead == nil {
		s.statusRead = s.obj.Status.DeepCopy()
	}
	s.obj.Status.Autoscaling = st
}

func describeReadings(readings []servingv1.SignalReading) string {
	msg := ""
	for i, r := range readings {
		if i > 0 {
			msg += "; "
		}
		msg += fmt.Sprintf("%s %s per replica against a target of %d asks for %d", r.Signal, r.PerReplica, r.Target, r.Replicas)
	}
	return msg
}
