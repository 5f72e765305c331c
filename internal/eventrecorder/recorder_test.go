package eventrecorder

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"

	"github.com/aiinference/operator/test/testutil"
)

// clock is a time that moves on by a millisecond at each reading, so that two
// Events never share a name, and jumps when told.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(time.Millisecond)
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// TestEventsAgainstTheAPIServer records Events about a ConfigMap through a real
// kube-apiserver: a repeat becomes the series of the first Event, a repeat
// after another reason too, one after the series window a new Event, a note
// over the API's limit is cut and accepted, and a series whose Event is gone
// makes it again.
func TestEventsAgainstTheAPIServer(t *testing.T) {
	g := NewWithT(t)
	cfg, _ := testutil.StartEnvtest(t, false)
	cs := kubernetes.NewForConfigOrDie(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cm, err := cs.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "chat"}}, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	cm.SetGroupVersionKind(schema.GroupVersionKind{Version: "v1", Kind: "ConfigMap"})

	clk := &clock{t: time.Now()}
	r := newRecorder(apiSink{cs.EventsV1()}, clientgoscheme.Scheme, "aiinference-operator", "aiinference-operator-test", clk.now, logr.Discard())
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Start(runCtx) }()
	defer func() { stop(); <-done }()

	events := func(g Gomega) map[string]eventsv1.Event {
		list, err := cs.EventsV1().Events("default").List(ctx, metav1.ListOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		byNote := map[string]eventsv1.Event{}
		for _, e := range list.Items {
			byNote[e.Reason+": "+e.Note] = e
		}
		return byNote
	}
	count := func(e eventsv1.Event) int32 {
		if e.Series == nil {
			return 1
		}
		return e.Series.Count
	}

	r.Eventf(cm, nil, corev1.EventTypeNormal, "Ready", "Reconcile", "all %d replicas Ready", 2)
	var first eventsv1.Event
	g.Eventually(func(g Gomega) {
		first = events(g)["Ready: all 2 replicas Ready"]
		g.Expect(first.Name).NotTo(BeEmpty())
	}).WithTimeout(30 * time.Second).Should(Succeed())
	g.Expect(first.Regarding.UID).To(Equal(cm.UID))
	g.Expect(first.ReportingController).To(Equal("aiinference-operator"))
	g.Expect(first.ReportingInstance).To(Equal("aiinference-operator-test"))
	g.Expect(first.Action).To(Equal("Reconcile"))
	g.Expect(first.Type).To(Equal(corev1.EventTypeNormal))

	r.Eventf(cm, nil, corev1.EventTypeNormal, "Ready", "Reconcile", "all %d replicas Ready", 2)
	r.Eventf(cm, nil, corev1.EventTypeWarning, "EngineCrashLooping", "Reconcile", "the engine exited")
	r.Eventf(cm, nil, corev1.EventTypeNormal, "Ready", "Reconcile", "all %d replicas Ready", 2)
	g.Eventually(func(g Gomega) {
		all := events(g)
		g.Expect(all).To(HaveLen(2))
		g.Expect(count(all["Ready: all 2 replicas Ready"])).To(Equal(int32(3)))
		g.Expect(all["Ready: all 2 replicas Ready"].Name).To(Equal(first.Name))
	}).WithTimeout(30 * time.Second).Should(Succeed())

	// After the window, the same words make a new Event.
	clk.advance(seriesWindow + time.Minute)
	r.Eventf(cm, nil, corev1.EventTypeNormal, "Ready", "Reconcile", "all %d replicas Ready", 2)
	var later string
	g.Eventually(func(g Gomega) {
		list, err := cs.EventsV1().Events("default").List(ctx, metav1.ListOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(list.Items).To(HaveLen(3))
		for _, e := range list.Items {
			if e.Reason == "Ready" && e.Name != first.Name {
				later = e.Name
			}
		}
		g.Expect(later).NotTo(BeEmpty())
	}).WithTimeout(30 * time.Second).Should(Succeed())

	// A series update whose Event was deleted makes the Event again.
	g.Expect(cs.EventsV1().Events("default").Delete(ctx, later, metav1.DeleteOptions{})).To(Succeed())
	r.Eventf(cm, nil, corev1.EventTypeNormal, "Ready", "Reconcile", "all %d replicas Ready", 2)
	g.Eventually(func() error {
		_, err := cs.EventsV1().Events("default").Get(ctx, later, metav1.GetOptions{})
		return err
	}).WithTimeout(30 * time.Second).Should(Succeed())

	// A note over the API server's 1 KB is cut on a character boundary, not refused.
	long := strings.Repeat("é", 1000)
	r.Eventf(cm, nil, corev1.EventTypeWarning, "LoadFailed", "Reconcile", "%s", long)
	g.Eventually(func(g Gomega) {
		var note string
		for _, e := range events(g) {
			if e.Reason == "LoadFailed" {
				note = e.Note
			}
		}
		g.Expect(note).NotTo(BeEmpty())
		g.Expect(len(note)).To(BeNumerically("<=", maxNoteBytes))
		g.Expect(utf8.ValidString(note)).To(BeTrue())
	}).WithTimeout(30 * time.Second).Should(Succeed())
}

// blockedSink is a fake API that never answers until released.
type blockedSink struct{ release chan struct{} }

func (s blockedSink) create(ctx context.Context, _ *eventsv1.Event) error {
	<-s.release
	return nil
}

func (s blockedSink) patchSeries(ctx context.Context, _, _ string, _ *eventsv1.EventSeries) error {
	<-s.release
	return nil
}

// TestAFullQueueDropsAndNeverBlocks: with the API server stuck, recording
// returns at once, and what does not fit the queue is dropped.
func TestAFullQueueDropsAndNeverBlocks(t *testing.T) {
	sink := blockedSink{release: make(chan struct{})}
	r := newRecorder(sink, clientgoscheme.Scheme, "c", "c-test", (&clock{t: time.Now()}).now, logr.Discard())
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Start(ctx) }()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "chat", UID: types.UID("u1")}}
	cm.SetGroupVersionKind(schema.GroupVersionKind{Version: "v1", Kind: "ConfigMap"})
	start := time.Now()
	for i := range 10 * queueLength {
		r.Eventf(cm, nil, corev1.EventTypeNormal, "Step", "Reconcile", "step %d", i)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("recording %d Events with the API stuck took %v", 10*queueLength, d)
	}
	queued := 0
	for _, q := range r.queues {
		queued += len(q)
	}
	if queued != queueLength {
		t.Errorf("%d Events queued for one object, want the queue's %d", queued, queueLength)
	}
	close(sink.release)
	stop()
	<-done
	r.mu.Lock()
	defer r.mu.Unlock()
	if n := len(r.recent["u1"]); n > perObject {
		t.Errorf("%d Events remembered for one object, want at most %d", n, perObject)
	}
}

// TestForgetsWhatNoRepeatCanJoin: the memory per object empties once its
// Events are older than the series window.
func TestForgetsWhatNoRepeatCanJoin(t *testing.T) {
	clk := &clock{t: time.Now()}
	r := newRecorder(blockedSink{}, clientgoscheme.Scheme, "c", "c-test", clk.now, logr.Discard())
	for i := range 100 {
		r.remember(types.UID(strings.Repeat("x", i+1)), 1, "default", "o", clk.now())
	}
	clk.advance(seriesWindow + 2*time.Minute)
	r.remember("other", 1, "default", "o", clk.now())
	if len(r.recent) != 1 {
		t.Errorf("%d objects remembered after the window, want 1", len(r.recent))
	}
}

func TestRetriable(t *testing.T) {
	gr := schema.GroupResource{Group: "events.k8s.io", Resource: "events"}
	for err, want := range map[error]bool{
		errors.New("connection refused"):                                                        true,
		apierrors.NewTooManyRequests("slow down", 1):                                            true,
		apierrors.NewServiceUnavailable("starting"):                                             true,
		apierrors.NewInternalError(errors.New("etcd")):                                          true,
		apierrors.NewInvalid(schema.GroupKind{}, "e", nil):                                      false,
		apierrors.NewForbidden(gr, "e", errors.New("no")):                                       false,
		apierrors.NewAlreadyExists(gr, "e"):                                                     false,
		apierrors.NewGenericServerResponse(http.StatusBadGateway, "POST", gr, "e", "", 0, true): true,
	} {
		if got := retriable(err); got != want {
			t.Errorf("retriable(%v) = %v, want %v", err, got, want)
		}
	}
}
