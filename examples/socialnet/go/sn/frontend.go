package sn

// The frontend: one function per API, as DeathStarBench's nginx serves
// /wrk2-api/... Each checks its request and calls the service behind it.

// PostComposeAPI (sn-post-compose): {username, user_id, text, media_ids,
// media_types, post_type} → {post_id, timestamp}.
func PostComposeAPI(ctx Ctx, in []byte) ([]byte, error) {
	var req composeReq
	if err := decode(in, &req); err != nil {
		return nil, err
	}
	if err := req.check(); err != nil {
		return nil, err
	}
	return ctx.Call(SvcComposePost, in)
}

// HomeTimelineReadAPI (sn-home-timeline-read): {user_id, start, stop} →
// [post].
func HomeTimelineReadAPI(ctx Ctx, in []byte) ([]byte, error) {
	return readTimeline(ctx, in, SvcHomeTimeline, "read_home_timeline")
}

// UserTimelineReadAPI (sn-user-timeline-read): {user_id, start, stop} →
// [post].
func UserTimelineReadAPI(ctx Ctx, in []byte) ([]byte, error) {
	return readTimeline(ctx, in, SvcUserTimeline, "read_user_timeline")
}

func readTimeline(ctx Ctx, in []byte, svc, op string) ([]byte, error) {
	var r Range
	if err := decode(in, &r); err != nil {
		return nil, err
	}
	if err := r.check(); err != nil {
		return nil, err
	}
	return callRaw(ctx, svc, map[string]any{"op": op, "user_id": r.UserID, "start": r.Start, "stop": r.Stop})
}

// UserFollowAPI (sn-user-follow): {user_id, followee_id} or {user_name,
// followee_name}.
func UserFollowAPI(ctx Ctx, in []byte) ([]byte, error) {
	var req graphReq
	if err := decode(in, &req); err != nil {
		return nil, err
	}
	if req.Op != "" {
		return nil, badInput("unknown field op")
	}
	if req.UserName != "" || req.FolloweeName != "" {
		return callRaw(ctx, SvcSocialGraph, map[string]any{"op": "follow_with_username",
			"user_name": req.UserName, "followee_name": req.FolloweeName})
	}
	return callRaw(ctx, SvcSocialGraph, map[string]any{"op": "follow", "user_id": req.UserID,
		"followee_id": req.FolloweeID})
}

// UserRegisterAPI (sn-user-register): {first_name, last_name, username,
// password, user_id (optional)} → {user_id}.
func UserRegisterAPI(ctx Ctx, in []byte) ([]byte, error) {
	var req userReq
	if err := decode(in, &req); err != nil {
		return nil, err
	}
	if req.Op != "" {
		return nil, badInput("unknown field op")
	}
	req.Op = "register"
	return callRaw(ctx, SvcUser, req)
}

// UserLoginAPI (sn-user-login): {username, password} → {token}.
func UserLoginAPI(ctx Ctx, in []byte) ([]byte, error) {
	var req struct {
		Username string `json:"username"`
		Password string `json:"password"`
	}
	if err := decode(in, &req); err != nil {
		return nil, err
	}
	return callRaw(ctx, SvcUser, map[string]any{"op": "login", "username": req.Username, "password": req.Password})
}

// callRaw calls a service and passes its answer on as it is.
func callRaw(ctx Ctx, name string, req any) ([]byte, error) {
	var out rawJSON
	if err := call(ctx, name, req, &out); err != nil {
		return nil, err
	}
	return out, nil
}

type rawJSON []byte

func (r *rawJSON) UnmarshalJSON(b []byte) error {
	*r = append((*r)[:0], b...)
	return nil
}
