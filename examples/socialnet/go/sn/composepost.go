package sn

import (
	"time"
	"unicode/utf8"
)

// PostTextMax bounds a post's text, in bytes.
const PostTextMax = 4096

// MediaMax bounds a post's media.
const MediaMax = 16

type composeReq struct {
	Username   string   `json:"username"`
	UserID     int64    `json:"user_id"`
	Text       string   `json:"text"`
	MediaIDs   []int64  `json:"media_ids"`
	MediaTypes []string `json:"media_types"`
	PostType   string   `json:"post_type"`
	ReqID      int64    `json:"req_id"`
}

func (r *composeReq) check() error {
	if r.UserID <= 0 || !usernameRe.MatchString(r.Username) {
		return badInput("a post needs the author's user_id and username")
	}
	if len(r.Text) > PostTextMax || !utf8.ValidString(r.Text) {
		return badInput("text must be UTF-8, at most %d bytes", PostTextMax)
	}
	if len(r.MediaIDs) != len(r.MediaTypes) || len(r.MediaIDs) > MediaMax {
		return badInput("media_ids and media_types must pair up, at most %d", MediaMax)
	}
	if r.PostType == "" {
		r.PostType = "POST"
	}
	if !postTypes[r.PostType] {
		return badInput("post_type must be POST, REPOST, REPLY or DM")
	}
	return nil
}

// ComposePost (sn-compose-post): a new post. Its parts are made at once by
// sn-text (which calls sn-url-shorten and sn-user-mention), sn-unique-id,
// sn-media and sn-user; then the post is stored and written to the
// author's and the followers' timelines, again at once (DeathStarBench's
// ComposePostService). It answers only when all of it is written.
func ComposePost(ctx Ctx, in []byte) ([]byte, error) {
	var req composeReq
	if err := decode(in, &req); err != nil {
		return nil, err
	}
	if err := req.check(); err != nil {
		return nil, err
	}
	var (
		text  TextResult
		media []Media
		id    struct {
			PostID int64 `json:"post_id"`
		}
		creator Creator
	)
	err := parallel(
		func() error {
			return call(ctx, SvcText, map[string]any{"op": "compose_text", "text": req.Text}, &text)
		},
		func() error {
			return call(ctx, SvcUniqueID, map[string]any{"op": "compose_unique_id", "post_type": req.PostType}, &id)
		},
		func() error {
			return call(ctx, SvcMedia, map[string]any{"op": "compose_media", "media_ids": req.MediaIDs,
				"media_types": req.MediaTypes}, &media)
		},
		func() error {
			return call(ctx, SvcUser, map[string]any{"op": "compose_creator", "user_id": req.UserID,
				"username": req.Username}, &creator)
		},
	)
	if err != nil {
		return nil, err
	}
	post := Post{
		PostID: id.PostID, Creator: creator, ReqID: req.ReqID, Text: text.Text,
		UserMentions: nonNil(text.UserMentions), Media: nonNil(media), URLs: nonNil(text.URLs),
		Timestamp: time.Now().UnixMilli(), PostType: req.PostType,
	}
	mentionIDs := make([]int64, 0, len(post.UserMentions))
	for _, m := range post.UserMentions {
		mentionIDs = append(mentionIDs, m.UserID)
	}
	err = parallel(
		func() error {
			return call(ctx, SvcPostStorage, map[string]any{"op": "store_post", "post": post}, nil)
		},
		func() error {
			return call(ctx, SvcUserTimeline, map[string]any{"op": "write_user_timeline", "user_id": post.Creator.UserID,
				"post_id": post.PostID, "timestamp": post.Timestamp}, nil)
		},
		func() error {
			return call(ctx, SvcHomeTimeline, map[string]any{"op": "write_home_timeline", "user_id": post.Creator.UserID,
				"post_id": post.PostID, "timestamp": post.Timestamp, "user_mention_ids": mentionIDs}, nil)
		},
	)
	if err != nil {
		return nil, err
	}
	return reply(map[string]int64{"post_id": post.PostID, "timestamp": post.Timestamp})
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
