// Package eventrecorder writes the controller's events.k8s.io/v1 Events with
// memory bounded by the objects it watches, not by the events it has sent.
//
// client-go's events broadcaster, which controller-runtime's recorder uses, keeps
// a copy of every Event it sent for 6 to 12 minutes to fold repeats into a
// series, and it sends each Event from a goroutine of its own. At 1,000 objects
// becoming Ready that was about 5,000 Events, 2.5 to 6 MB of the operator's live
// heap (docs/performance.md). This recorder remembers, per object, only its last
// few distinct Events (a key and a name), and sends through a fixed set of
// workers with a bounded queue: a repeat within seriesWindow of its last sight
// patches the Event's series, as client-go's does, and a full queue drops the
// Event and says so in the log, as client-go's does.
package eventrecorder

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"os"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	eventsv1client "k8s.io/client-go/kubernetes/typed/events/v1"
	"k8s.io/client-go/tools/reference"
)

const (
	// seriesWindow is how long after its last sight a repeat still counts in an
	// Event's series rather than making a new Event (client-go's finishTime).
	seriesWindow = 6 * time.Minute
	// perObject is how many distinct Events are remembered per object: an object
	// going back and forth between two reasons makes two series, not an Event per
	// change.
	perObject = 4
	// workers send Events side by side; an object's Events always go through the
	// same worker, so that its series counts arrive in order.
	workers     = 4
	queueLength = 250 // per worker
	// A write the API server could not answer is tried again every
	// retryInterval (jittered), at most maxTries times in all (client-go's
	// figures).
	retryInterval = 10 * time.Second
	maxTries      = 12
	// maxNoteBytes is the API server's limit on an Event's note.
	maxNoteBytes = 1024
	// flushTimeout bounds how long a stopping recorder still sends what it holds.
	flushTimeout = 5 * time.Second
)

// sink is where Events go: the events.k8s.io/v1 API.
type sink interface {
	create(ctx context.Context, event *eventsv1.Event) error
	patchSeries(ctx context.Context, namespace, name string, series *eventsv1.EventSeries) error
}

// Recorder is a controller's events.EventRecorder. Start runs its workers; it is
// a manager.Runnable that runs on every replica, since only the leader
// reconciles and so records.
type Recorder struct {
	sink                 sink
	scheme               *runtime.Scheme
	controller, instance string
	now                  func() time.Time
	log                  logr.Logger
	seed                 maphash.Seed
	queues               [workers]chan write

	mu        sync.Mutex
	recent    map[types.UID][]recentEvent
	lastPrune time.Time
}

// recentEvent is an Event the recorder sent and may count repeats of.
type recentEvent struct {
	key                 uint64 // type, action, reason, note and related object
	namespace, name     string
	count               int32
	eventTime, lastSeen time.Time
}

// write is one request to the API server: a new Event, or a series update.
type write struct {
	event  *eventsv1.Event // the Event to create (also when a series update finds it gone)
	series *eventsv1.EventSeries
}

// New makes a Recorder that reports as controller, with this host's name as its
// instance (as client-go does).
func New(client eventsv1client.EventsGetter, scheme *runtime.Scheme, controller string, log logr.Logger) *Recorder {
	host, _ := os.Hostname()
	return newRecorder(apiSink{client}, scheme, controller, controller+"-"+host, time.Now, log)
}

func newRecorder(s sink, scheme *runtime.Scheme, controller, instance string, now func() time.Time, log logr.Logger) *Recorder {
	r := &Recorder{sink: s, scheme: scheme, controller: controller, instance: instance, now: now, log: log,
		seed: maphash.MakeSeed(), recent: map[types.UID][]recentEvent{}}
	for i := range r.queues {
		r.queues[i] = make(chan write, queueLength)
	}
	return r
}

// Eventf records an Event about regarding; note is formatted with args.
func (r *Recorder) Eventf(regarding, related runtime.Object, eventtype, reason, action, note string, args ...any) {
	r.AnnotatedEventf(regarding, related, nil, eventtype, reason, action, note, args...)
}

// AnnotatedEventf is Eventf with annotations on the Event.
func (r *Recorder) AnnotatedEventf(regarding, related runtime.Object, annotations map[string]string, eventtype, reason, action, note string, args ...any) {
	message := truncate(fmt.Sprintf(note, args...), maxNoteBytes)
	ref, err := reference.GetReference(r.scheme, regarding)
	if err != nil {
		r.log.Error(err, "Could not make a reference to the object, so no Event", "reason", reason, "note", message)
		return
	}
	var relatedRef *corev1.ObjectReference
	if related != nil {
		if relatedRef, err = reference.GetReference(r.scheme, related); err != nil {
			r.log.V(1).Info("Could not make a reference to the related object", "error", err.Error())
		}
	}
	if eventtype != corev1.EventTypeNormal && eventtype != corev1.EventTypeWarning {
		r.log.Error(nil, "Unsupported Event type", "type", eventtype, "reason", reason)
		return
	}
	h := maphash.Hash{}
	h.SetSeed(r.seed)
	for _, s := range []string{eventtype, action, reason, message} {
		h.WriteString(s)
		h.WriteByte(0)
	}
	if relatedRef != nil {
		h.WriteString(string(relatedRef.UID) + relatedRef.Kind + relatedRef.Namespace + relatedRef.Name)
	}
	key := h.Sum64()

	now := r.now()
	w := r.remember(ref.UID, key, ref.Namespace, ref.Name, now)
	w.event = &eventsv1.Event{
		ObjectMeta: metav1.ObjectMeta{Name: w.event.Name, Namespace: w.event.Namespace, Annotations: annotations},
		EventTime:  metav1.NewMicroTime(w.event.EventTime.Time), ReportingController: r.controller, ReportingInstance: r.instance,
		Action: action, Reason: reason, Regarding: *ref, Related: relatedRef, Note: message, Type: eventtype,
	}
	select {
	case r.queues[maphash.String(r.seed, string(ref.UID))%workers] <- w:
	default:
		r.log.Error(nil, "Too many Events queued, so this one is dropped", "object", ref.Namespace+"/"+ref.Name, "reason", reason, "note", message)
	}
}

// remember notes an Event of object uid and says what to write: a new Event,
// or (for a repeat within seriesWindow) a series update of the earlier one. The
// returned write's event carries only the name, namespace and event time.
func (r *Recorder) remember(uid types.UID, key uint64, namespace, objectName string, now time.Time) write {
	r.mu.Lock()
	defer r.mu.Unlock()
	if now.Sub(r.lastPrune) > time.Minute {
		r.prune(now)
	}
	events := r.recent[uid]
	for i := range events {
		e := &events[i]
		if e.key != key || now.Sub(e.lastSeen) > seriesWindow {
			continue
		}
		e.count++
		e.lastSeen = now
		return write{
			event:  &eventsv1.Event{ObjectMeta: metav1.ObjectMeta{Name: e.name, Namespace: e.namespace}, EventTime: metav1.NewMicroTime(e.eventTime)},
			series: &eventsv1.EventSeries{Count: e.count, LastObservedTime: metav1.NewMicroTime(now)},
		}
	}
	if namespace == "" {
		namespace = metav1.NamespaceDefault
	}
	// The name client-go gives an Event: the object's name and the time in hex.
	e := recentEvent{key: key, namespace: namespace, name: fmt.Sprintf("%s.%x", objectName, now.UnixNano()), count: 1, eventTime: now, lastSeen: now}
	if len(events) == perObject {
		oldest := 0
		for i := range events {
			if events[i].lastSeen.Before(events[oldest].lastSeen) {
				oldest = i
			}
		}
		events = append(events[:oldest], events[oldest+1:]...)
	}
	r.recent[uid] = append(events, e)
	return write{event: &eventsv1.Event{ObjectMeta: metav1.ObjectMeta{Name: e.name, Namespace: e.namespace}, EventTime: metav1.NewMicroTime(now)}}
}

// prune forgets Events no repeat can join any more; r.mu is held.
func (r *Recorder) prune(now time.Time) {
	r.lastPrune = now
	for uid, events := range r.recent {
		kept := events[:0]
		for _, e := range events {
			if now.Sub(e.lastSeen) <= seriesWindow {
				kept = append(kept, e)
			}
		}
		if len(kept) == 0 {
			delete(r.recent, uid)
		} else {
			r.recent[uid] = kept
		}
	}
}

// NeedLeaderElection is false: the workers run on every replica, and only the
// leader, which reconciles, gives them Events.
func (r *Recorder) NeedLeaderElection() bool { return false }

// Start sends Events until ctx ends, then for at most flushTimeout what is queued.
func (r *Recorder) Start(ctx context.Context) error {
	var wg sync.WaitGroup
	flush, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	for _, queue := range r.queues {
		wg.Go(func() {
			for {
				select {
				case w := <-queue:
					r.send(ctx, w)
				case <-ctx.Done():
					for {
						select {
						case w := <-queue:
							r.send(flush, w)
						default:
							return
						}
					}
				}
			}
		})
	}
	<-ctx.Done()
	time.AfterFunc(flushTimeout, cancel)
	wg.Wait()
	return nil
}

// send writes w, trying again while the API server cannot answer. A series
// update whose Event is gone (it expired) creates the Event afresh.
func (r *Recorder) send(ctx context.Context, w write) {
	for try := 1; ; try++ {
		var err error
		if w.series != nil {
			err = r.sink.patchSeries(ctx, w.event.Namespace, w.event.Name, w.series)
			if apierrors.IsNotFound(err) {
				w.series = nil
				w.event.EventTime = metav1.NewMicroTime(r.now())
				err = r.sink.create(ctx, w.event)
			}
		} else {
			err = r.sink.create(ctx, w.event)
		}
		if err == nil || !retriable(err) {
			if err != nil {
				r.log.Error(err, "The API server refused an Event", "event", w.event.Namespace+"/"+w.event.Name, "reason", w.event.Reason)
			}
			return
		}
		if try == maxTries || ctx.Err() != nil {
			r.log.Error(err, "Could not write an Event, giving up", "event", w.event.Namespace+"/"+w.event.Name, "reason", w.event.Reason, "tries", try)
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(retryInterval/2 + rand.N(retryInterval)):
		}
	}
}

// retriable is true for an error the same request may not meet again: the API
// server unreachable, overloaded or failing, not a refusal of the Event.
func retriable(err error) bool {
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return true // a transport error
	}
	return apierrors.IsTooManyRequests(err) || apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) ||
		apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err) || apierrors.IsUnexpectedServerError(err)
}

// truncate cuts s to at most n bytes, on a character boundary.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// apiSink writes through the typed events.k8s.io/v1 client.
type apiSink struct{ client eventsv1client.EventsGetter }

func (s apiSink) create(ctx context.Context, event *eventsv1.Event) error {
	_, err := s.client.Events(event.Namespace).Create(ctx, event, metav1.CreateOptions{})
	return err
}

func (s apiSink) patchSeries(ctx context.Context, namespace, name string, series *eventsv1.EventSeries) error {
	patch, err := json.Marshal(map[string]any{"series": series})
	if err != nil {
		return err
	}
	_, err = s.client.Events(namespace).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}
